"""Training the speculative streams (lossless mode: the base model stays frozen).

Objective: sum over streams j of alpha_j * cross-entropy(stream j at position t, token t+1+j),
on self-distilled sequences (see `distill`). The frozen lower layers' states come from the
distillation shards; each step runs the main stream through the top layers (no gradient, to
fill the MSA layers' keys/values), then the streams at a random sample of answer positions.

Runs on one process or under `torchrun --nproc_per_node=N` (DistributedDataParallel over gloo
on CPU; each rank trains on its own slice of the data). Checkpoints are written atomically and
a run resumes from the last one.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.model import Transformer
from edgestream.llm.msa import (
    SpeculativeStreams,
    StreamConfig,
    adapter_for,
    stream_inputs,
    stream_layer,
)
from edgestream.training import distributed_context, save_atomic

IGNORE = -100  # cross-entropy target for positions without a label


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_sequences: int = 4  # sequences per step (per rank)
    positions_per_sequence: int = 128  # answer positions whose streams train, per sequence
    # Prompt positions trained as well, per sequence: their targets are the prompt's own text
    # (as Medusa-1 trains on real text), not the model's answers, but they cost no distillation.
    prompt_positions_per_sequence: int = 0
    lr: float = 2e-3
    warmup_steps: int = 100
    stream_weight: float = 0.1  # alpha_j, the same for every stream as in the paper
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "batch_sequences", "positions_per_sequence", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_positions_per_sequence < 0:
            raise ValueError(
                f"prompt_positions_per_sequence must be >= 0, got "
                f"{self.prompt_positions_per_sequence}"
            )


@dataclass
class Batch:
    split_hidden: Tensor  # (B, L, dim) states entering layer `captured_at`, zero-padded
    tokens: Tensor  # (B, L) token ids, padded with IGNORE
    positions: Tensor  # (B, n) positions t whose streams are trained (padded with 0)
    targets: Tensor  # (B, n, gamma) token t+1+j or IGNORE
    prompt_lengths: Tensor  # (B,) where each sequence's answer starts


def make_batch(records: list[dict], config: TrainConfig, gamma: int, rng: random.Random) -> Batch:
    """Pad a few distilled sequences together and sample stream positions in their answers
    (and, with `config.prompt_positions_per_sequence`, in their prompts)."""
    L = max(len(r["tokens"]) for r in records)
    B, dim = len(records), records[0]["split_hidden"].shape[-1]
    hidden = torch.zeros(B, L, dim, dtype=records[0]["split_hidden"].dtype)
    tokens = torch.full((B, L), IGNORE, dtype=torch.long)
    n_answer, n_prompt = config.positions_per_sequence, config.prompt_positions_per_sequence
    n = n_answer + n_prompt
    positions = torch.zeros(B, n, dtype=torch.long)
    targets = torch.full((B, n, gamma), IGNORE, dtype=torch.long)
    for b, r in enumerate(records):
        seq, states = r["tokens"], r["split_hidden"]
        tokens[b, : len(seq)] = seq
        hidden[b, : len(states)] = states
        # Stream j at t predicts t+1+j: from the last prompt token to where stream 1 has a label.
        answer = range(r["prompt_length"] - 1, len(seq) - 2)
        prompt = range(0, min(r["prompt_length"] - 1, len(seq) - 2))
        chosen = sorted(
            rng.sample(answer, min(n_answer, len(answer)))
            + rng.sample(prompt, min(n_prompt, len(prompt)))
        )
        for i, t in enumerate(chosen):
            positions[b, i] = t
            for j in range(gamma):
                if t + 2 + j < len(seq):
                    targets[b, i, j] = seq[t + 2 + j]
    lengths = torch.tensor([r["prompt_length"] for r in records])
    return Batch(hidden, tokens, positions, targets, lengths)


def draft_targets(token_targets: Tensor, target_index: Tensor) -> tuple[Tensor, Tensor]:
    """Token ids -> rows of a draft LM head (IGNORE where unlabelled or outside its vocabulary),
    and the mask of labelled entries."""
    labelled = token_targets != IGNORE
    targets = torch.where(labelled, target_index[token_targets.clamp(min=0)], IGNORE)
    return targets, targets != IGNORE


class StreamObjective(nn.Module):
    """The training forward pass; a module so DistributedDataParallel can wrap it."""

    def __init__(self, model: Transformer, streams: SpeculativeStreams, captured_at: int) -> None:
        super().__init__()
        if not captured_at <= streams.split:
            raise ValueError(
                f"states were captured at layer {captured_at}, above the first MSA layer "
                f"{streams.split}: distill with a lower split or use fewer stream layers"
            )
        self.model = model
        self.streams = streams
        self.captured_at = captured_at
        vocab = model.config.vocab_size
        if streams.config.draft_vocab_size:
            ids = streams.draft_vocab
            self.register_buffer(
                "head_weight", model.lm_head_weight()[ids].detach(), persistent=False
            )
            # Targets outside the draft vocabulary cannot be drafted: no label for them.
            lookup = torch.full((vocab,), IGNORE, dtype=torch.long)
            lookup[ids] = torch.arange(len(ids))
        else:
            self.register_buffer("head_weight", model.lm_head_weight().detach(), persistent=False)
            lookup = torch.arange(vocab)
        self.register_buffer("target_index", lookup, persistent=False)

    def forward(self, batch: Batch, stream_weight: float) -> tuple[Tensor, Tensor, Tensor]:
        """Returns (loss, top-1 hits per stream, labels per stream)."""
        gamma = self.streams.config.n_streams
        logits = self.draft_logits(batch)
        targets, labelled = draft_targets(batch.targets, self.target_index)
        per_stream = [
            F.cross_entropy(
                logits[:, :, j].flatten(0, 1),
                targets[:, :, j].flatten(),
                ignore_index=IGNORE,
                reduction="sum",
            )
            / labelled[:, :, j].sum().clamp(min=1)
            for j in range(gamma)
        ]
        loss = stream_weight * torch.stack(per_stream).sum()
        hits = ((logits.argmax(-1) == targets) & labelled).sum(dim=(0, 1))
        return loss, hits.detach(), labelled.sum(dim=(0, 1))

    def draft_logits(self, batch: Batch) -> Tensor:
        """(B, n, gamma, draft vocabulary) float32 logits of every stream at `batch.positions`."""
        return F.linear(self.draft_states(batch), self.head_weight).float()

    def draft_states(self, batch: Batch) -> Tensor:
        """(B, n, gamma, dim) final-norm states of every stream at `batch.positions`: what the
        LM head reads."""
        model, streams = self.model, self.streams
        B, L, _ = batch.split_hidden.shape
        gamma = streams.config.n_streams
        cache = model.new_cache(L, batch_size=B)
        slots = torch.arange(L)
        mask = (slots[None, :] <= slots[:, None])[None, None]  # causal (1, 1, L, L)
        rope = model.rope(slots.expand(B, L), model.dtype)
        node_mask = mask[0, 0][batch.positions][:, None]  # (B, 1, n, L): rows of the chosen t
        x, s = batch.split_hidden.to(model.dtype), None
        for i in range(self.captured_at, model.config.n_layers):
            block = model.layers[i]
            if i == streams.split:
                start = x.gather(1, batch.positions[:, :, None].expand(-1, -1, x.shape[-1]))
                next_tokens = (
                    batch.tokens.gather(1, batch.positions + 1) if streams.token_aware else None
                )
                s, srope, smask = stream_inputs(
                    model, streams, start, batch.positions, node_mask, next_tokens
                )
            with torch.no_grad():
                x = block(x, rope, mask, cache, i)
            if s is not None:
                s = stream_layer(block, adapter_for(streams, i), s, srope, smask, cache, i, L)
        assert s is not None
        return model.norm(s).view(B, -1, gamma, s.shape[-1])

    def vocabulary_ids(self, rows: Tensor) -> Tensor:
        """Rows of the draft head -> the model's token ids."""
        return self.streams.draft_vocab[rows] if self.streams.config.draft_vocab_size else rows


@torch.no_grad()
def advance_states(
    model: Transformer, records: list[dict], captured_at: int, split: int
) -> list[dict]:
    """Copies of the records with states moved up through the frozen layers [captured_at, split).

    Distillation may capture states below the first MSA layer (so one distillation serves
    several N_s); running the layers in between once here, not at every step, saves their
    cost in every later epoch.
    """
    advanced = []
    for record in records:
        x = record["split_hidden"][None].to(model.dtype)
        L = x.shape[1]
        cache = model.new_cache(L)
        slots = torch.arange(L)
        mask = (slots[None, :] <= slots[:, None])[None, None]
        rope = model.rope(slots[None], model.dtype)
        for i in range(captured_at, split):
            x = model.layers[i](x, rope, mask, cache, i)
        advanced.append({**record, "split_hidden": x[0].to(record["split_hidden"].dtype)})
    return advanced


def frequent_answer_tokens(records: list[dict], n: int) -> Tensor:
    """The n most frequent tokens in the distilled answers, most frequent first (ties by id)."""
    counts = torch.zeros(max(int(r["tokens"].max()) for r in records) + 1, dtype=torch.long)
    for r in records:
        answer = r["tokens"][r["prompt_length"] :]
        counts += torch.bincount(answer, minlength=len(counts))
    if n > len(counts):
        counts = torch.cat([counts, torch.zeros(n - len(counts), dtype=torch.long)])
    # A stable sort on descending counts keeps ties in id order, so every rank agrees.
    return torch.sort(counts, descending=True, stable=True).indices[:n]


def _lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * cosine_to_a_tenth(progress)


def cosine_to_a_tenth(progress: float) -> float:
    """The learning rate's share of its peak at `progress` (0..1) through the decay."""
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def clipped_step(optimizer: torch.optim.Optimizer, parameters: nn.Module, loss: Tensor) -> None:
    """One optimiser step on `loss`, gradients clipped to norm 1 over `parameters`' weights."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters.parameters(), 1.0)
    optimizer.step()


ProgressFn = Callable[[int, float, list[float]], None]


def train_streams(
    model: Transformer,
    records: list[dict],
    captured_at: int,
    stream_config: StreamConfig,
    config: TrainConfig,
    out_dir: Path,
    model_name: str,
    progress: ProgressFn | None = None,
    init_streams: SpeculativeStreams | None = None,
    dev_records: list[dict] = (),
) -> tuple[SpeculativeStreams, list[float] | None]:
    """Train (or resume training) streams; writes out_dir/checkpoint.pt as it goes.

    `init_streams` (trained streams, e.g. the bundled ones) continue training on these records
    instead of starting from scratch; they replace `stream_config`, draft vocabulary included,
    so what they learned keeps its meaning (`new_or_given_streams` says how `ffn_rank` adds
    to them). Returns the streams and, when `dev_records` are given, their top-1 accuracy per
    stream on those held-out sequences.
    """
    if not records:
        raise ValueError("no training sequences")
    torch.manual_seed(config.seed)  # identical initial streams on every rank
    streams = new_or_given_streams(model, stream_config, records, init_streams)
    if captured_at < streams.split:
        records = advance_states(model, records, captured_at, streams.split)
        dev_records = advance_states(model, dev_records, captured_at, streams.split)
        captured_at = streams.split
    objective = StreamObjective(model.requires_grad_(False), streams, captured_at)
    dev_top1 = fit(
        objective,
        streams,
        lambda module, batch: module(batch, config.stream_weight),
        records,
        streams.config.to_dict(),
        streams.config.n_streams,
        config,
        out_dir,
        model_name,
        progress,
        dev_records,
    )
    return streams, dev_top1


def new_or_given_streams(
    model: Transformer,
    stream_config: StreamConfig | None,
    records: list[dict],
    given: SpeculativeStreams | None,
) -> SpeculativeStreams:
    """Trainable float32 streams: `given` ones (their configuration wins, except that a
    `stream_config.ffn_rank` gives feed-forward adapters to given streams that lack them), or
    new ones whose draft vocabulary is the records' most frequent answer tokens (which needs a
    `stream_config`)."""
    if given is not None:
        if stream_config is not None and stream_config.ffn_rank and not given.config.ffn_rank:
            given.add_feed_forward_adapters(model.config, stream_config.ffn_rank)
        return given.float().requires_grad_(True).train()
    streams = SpeculativeStreams(model.config, stream_config)
    if stream_config.draft_vocab_size:
        streams.draft_vocab.copy_(frequent_answer_tokens(records, stream_config.draft_vocab_size))
    return streams


def _digest(record: dict) -> str:
    return hashlib.sha1(record["tokens"].numpy().tobytes()).hexdigest()


def hold_out(
    records: list[dict], n: int, replayed: list[dict] = ()
) -> tuple[list[dict], list[dict]]:
    """(training, held-out) records. Held out: the sequences of `records` whose token digests
    are the n smallest distinct ones (n at most a tenth of the records), with every copy of
    them, so the same sequences are held out however records are ordered and none also trains.
    `replayed` records (earlier runs' data) only ever train, so a run that replays others is
    measured on the same held-out sequences as one that does not."""
    if n < 0:
        raise ValueError(f"cannot hold out {n} sequences")
    digests = [_digest(r) for r in records]
    held = set(sorted(set(digests))[: min(n, len(records) // 10)])
    return (
        [r for r, d in zip(records, digests, strict=True) if d not in held]
        + [r for r in replayed if _digest(r) not in held],
        [r for r, d in zip(records, digests, strict=True) if d in held],
    )


def every_answer_position(records: list[dict], config: TrainConfig, depth: int) -> Batch:
    """A batch of `records` whose positions are all of their answers' positions, in order
    (each sequence's list then padded), instead of a sample."""
    longest = max(len(r["tokens"]) for r in records)  # more positions than any answer has
    every_position = replace(
        config, positions_per_sequence=longest, prompt_positions_per_sequence=0
    )
    return make_batch(records, every_position, depth, random.Random(0))


@torch.no_grad()
def held_out_top1(
    objective: nn.Module,
    call: Callable[[nn.Module, Batch], tuple[Tensor, Tensor, Tensor]],
    records: list[dict],
    depth: int,
    config: TrainConfig,
) -> list[float]:
    """Top-1 accuracy per draft depth over every answer position of held-out sequences."""
    hits, labelled = torch.zeros(depth), torch.zeros(depth)
    for start in range(0, len(records), config.batch_sequences):
        chunk = records[start : start + config.batch_sequences]
        batch = every_answer_position(chunk, config, depth)
        _, batch_hits, batch_labelled = call(objective, batch)
        hits += batch_hits
        labelled += batch_labelled
    return (hits / labelled.clamp(min=1)).tolist()


def fit(
    objective: nn.Module,
    trained: nn.Module,
    call: Callable[[nn.Module, Batch], tuple[Tensor, Tensor, Tensor]],
    records: list[dict],
    settings: dict,
    depth: int,
    config: TrainConfig,
    out_dir: Path,
    model_name: str,
    progress: ProgressFn | None,
    dev_records: list[dict] = (),
) -> list[float] | None:
    """The optimisation loop both drafters share: AdamW with warm-up and cosine decay, DDP when
    launched by torchrun, atomic checkpoints in out_dir/checkpoint.pt, resumed when present.

    `trained` holds the parameters (and is what the checkpoint stores); `call(module, batch)`
    runs `objective` (or its DDP wrapper) on a batch and returns (loss, hits, labelled) per
    draft depth; `settings` must match a checkpoint's for it to be resumed. Returns the top-1
    accuracy per depth on `dev_records` after training (rank 0; None without them).
    """
    rank, world = distributed_context()
    optimizer = torch.optim.AdamW(trained.parameters(), lr=config.lr, weight_decay=0.0)
    checkpoint = out_dir / "checkpoint.pt"
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        if state.get("settings") != settings:
            raise ValueError(
                f"{checkpoint} was trained with {state.get('settings')}, not {settings}: "
                "choose another run folder"
            )
        trained.load_state_dict(state["weights"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    module: nn.Module = objective
    if world > 1:
        # Buffers (RoPE tables, the draft head) are identical everywhere: no need to resend.
        module = nn.parallel.DistributedDataParallel(objective, forward_sync_buffers=False)
    mine = records[rank::world]
    rng = random.Random(config.seed * 1000 + rank * 7919 + step)
    out_dir.mkdir(parents=True, exist_ok=True)
    while step < config.steps:
        batch = make_batch(
            rng.sample(mine, min(config.batch_sequences, len(mine))), config, depth, rng
        )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        loss, hits, labelled = call(module, batch)
        clipped_step(optimizer, trained, loss)
        step += 1
        if progress is not None and rank == 0:
            progress(step, loss.item(), (hits / labelled.clamp(min=1)).tolist())
        if rank == 0 and (step % config.checkpoint_every == 0 or step == config.steps):
            save_atomic(
                {
                    "weights": trained.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "settings": settings,
                    "train_config": asdict(config),
                    "model": model_name,
                },
                checkpoint,
            )
    if rank != 0 or not dev_records:
        return None
    return held_out_top1(objective, call, dev_records, depth, config)
