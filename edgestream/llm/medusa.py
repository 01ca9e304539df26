"""Medusa-1 heads (Cai et al., 2024): the baseline Speculative Streaming is compared with.

Medusa adds K decoding heads on the frozen base model's last hidden state (after the final
norm). Head k (0-based) is one residual block, x + SiLU(W_k x + b_k) with W_k zero at
initialisation, followed by its own LM head initialised from the base model's; it predicts the
token k + 2 places ahead (the base model's own head predicts the next one). Decoding builds the
same draft tree as Speculative Streaming from the heads' top-k candidates and verifies it with
the same tree mask (`baselines.generate_medusa`).

One departure from the original, for a like-for-like comparison on a CPU: each head's LM head
covers the same draft vocabulary as the streams (the most frequent answer tokens) instead of
all 49,152 tokens, which makes training and drafting ~6x cheaper. `extra_parameters` counts
what is stored; `full_vocab_parameters` what the original's heads would hold.

Trained in lossless mode like the streams, on the same self-distilled sequences with the same
number of steps and positions (`train_medusa`), with Medusa-1's loss weights 0.8^k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.int8 import Int8Linear
from edgestream.llm.model import Transformer
from edgestream.llm.train import (
    IGNORE,
    Batch,
    ProgressFn,
    TrainConfig,
    advance_states,
    draft_targets,
    fit,
    frequent_answer_tokens,
)
from edgestream.llm.weights_file import load_drafter, save_weights


@dataclass(frozen=True)
class MedusaConfig:
    n_heads: int = 4  # K: tokens drafted beyond the next one
    draft_vocab_size: int = 8192  # the heads' vocabulary (most frequent answer tokens); 0 = all
    loss_decay: float = 0.8  # head k's loss weight is loss_decay ** k, as in Medusa-1

    def __post_init__(self) -> None:
        if self.n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {self.n_heads}")
        if self.draft_vocab_size < 0:
            raise ValueError(f"draft_vocab_size must be >= 0, got {self.draft_vocab_size}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class MedusaHeads(nn.Module):
    """K residual blocks and LM heads, stored stacked so all heads run as one batched matmul."""

    def __init__(self, model_config: object, config: MedusaConfig) -> None:
        super().__init__()
        dim, vocab = model_config.dim, model_config.vocab_size
        if config.draft_vocab_size > vocab:
            raise ValueError(
                f"draft_vocab_size ({config.draft_vocab_size}) exceeds the vocabulary ({vocab}): "
                "use a smaller one, or 0 for all of it (--draft-vocab)"
            )
        self.config = config
        self.full_vocab = vocab
        size = config.draft_vocab_size or vocab
        K = config.n_heads
        self.block_weight = nn.Parameter(torch.zeros(K, dim, dim))  # zero: starts as identity
        self.block_bias = nn.Parameter(torch.zeros(K, dim))
        self.head_weight = nn.Parameter(torch.zeros(K, size, dim))
        # Token ids of each head row, most frequent first; set by `init_from`.
        self.register_buffer("draft_vocab", torch.arange(size))

    def init_from(self, model: Transformer, draft_vocab: Tensor | None) -> None:
        """Copy the base LM head's rows (for the draft vocabulary) into every head."""
        with torch.no_grad():
            if draft_vocab is not None:
                self.draft_vocab.copy_(draft_vocab)
            rows = model.lm_head_weight()[self.draft_vocab].to(self.head_weight.dtype)
            self.head_weight.copy_(rows.expand_as(self.head_weight))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def full_vocab_parameters(self) -> int:
        """Parameters of the original Medusa-1 heads (LM heads over the whole vocabulary)."""
        K, _, dim = self.head_weight.shape
        return self.block_weight.numel() + self.block_bias.numel() + K * self.full_vocab * dim

    def forward(self, hidden: Tensor) -> Tensor:
        """Final-norm states (..., dim) -> logits (..., K, V_draft) in the heads' dtype."""
        x = hidden.to(self.head_weight.dtype)[..., None, :]  # (..., 1, dim)
        x = x + F.silu(torch.einsum("...kd,ked->...ke", x, self.block_weight) + self.block_bias)
        return torch.einsum("...kd,kvd->...kv", x, self.head_weight)

    def top_k(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(dim,) one node's final-norm state -> token ids and log-probabilities, each (K, k)."""
        log_probs, index = torch.log_softmax(self(hidden).float(), -1).topk(k, -1)
        return self.draft_vocab[index], log_probs


class Int8MedusaHeads(nn.Module):
    """Medusa heads for drafting with int8 LM heads (`int8.Int8Linear`), as the streams draft
    with `--draft-dtype int8`, so the baseline stays like for like. The LM heads are nearly all
    of the heads' bytes (4 x 8,192 x 576 against 4 x 576 x 576); the residual blocks stay
    float32."""

    def __init__(self, heads: MedusaHeads) -> None:
        super().__init__()
        self.config, self.full_vocab = heads.config, heads.full_vocab
        self.block_weight = heads.block_weight.detach().float()
        self.block_bias = heads.block_bias.detach().float()
        self.lm_heads = nn.ModuleList(Int8Linear(w) for w in heads.head_weight.detach())
        self.register_buffer("draft_vocab", heads.draft_vocab)

    def forward(self, hidden: Tensor) -> Tensor:
        """Final-norm states (..., dim) -> float32 logits (..., K, V_draft)."""
        x = hidden.float()[..., None, :]
        x = x + F.silu(torch.einsum("...kd,ked->...ke", x, self.block_weight) + self.block_bias)
        return torch.stack([head(x[..., k, :]) for k, head in enumerate(self.lm_heads)], -2)

    top_k = MedusaHeads.top_k


class MedusaObjective(nn.Module):
    """sum_k decay^k * CE(head k at t, token t+2+k) on the base model's final hidden states.

    The batch's `split_hidden` holds the last decoder layer's output (before the final norm),
    computed once for all sequences (`train.advance_states`), so a step costs only the heads.
    """

    def __init__(self, model: Transformer, heads: MedusaHeads) -> None:
        super().__init__()
        self.norm = model.norm
        self.heads = heads
        lookup = torch.full((heads.full_vocab,), IGNORE, dtype=torch.long)
        lookup[heads.draft_vocab] = torch.arange(len(heads.draft_vocab))
        self.register_buffer("target_index", lookup, persistent=False)

    def forward(self, batch: Batch, head_weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Returns (loss, top-1 hits per head, labels per head)."""
        dim = batch.split_hidden.shape[-1]
        index = batch.positions[:, :, None].expand(-1, -1, dim)
        hidden = self.norm(batch.split_hidden.gather(1, index))  # (B, n, dim)
        logits = self.heads(hidden).float()  # (B, n, K, V)
        targets, labelled = draft_targets(batch.targets, self.target_index)
        per_head = torch.stack(
            [
                F.cross_entropy(
                    logits[:, :, k].flatten(0, 1),
                    targets[:, :, k].flatten(),
                    ignore_index=IGNORE,
                    reduction="sum",
                )
                / labelled[:, :, k].sum().clamp(min=1)
                for k in range(logits.shape[2])
            ]
        )
        hits = ((logits.argmax(-1) == targets) & labelled).sum(dim=(0, 1))
        return (head_weights * per_head).sum(), hits.detach(), labelled.sum(dim=(0, 1))


def train_medusa(
    model: Transformer,
    records: list[dict],
    captured_at: int,
    medusa_config: MedusaConfig,
    config: TrainConfig,
    out_dir: Path,
    model_name: str,
    progress: ProgressFn | None = None,
    init_heads: MedusaHeads | None = None,
) -> MedusaHeads:
    """Train (or resume training) Medusa heads on distilled records; see `train.fit`.
    `init_heads` (trained heads) continue training instead of new ones; their configuration,
    draft vocabulary included, replaces `medusa_config`."""
    if not records:
        raise ValueError("no training sequences")
    torch.manual_seed(config.seed)
    if init_heads is not None:
        heads = init_heads.float().requires_grad_(True).train()
        medusa_config = heads.config
    else:
        heads = MedusaHeads(model.config, medusa_config)
        size = medusa_config.draft_vocab_size
        heads.init_from(model, frequent_answer_tokens(records, size) if size else None)
    # Once, not every step: the frozen layers above the captured states, for every sequence.
    records = advance_states(model, records, captured_at, model.config.n_layers)
    objective = MedusaObjective(model.requires_grad_(False), heads)
    weights = medusa_config.loss_decay ** torch.arange(medusa_config.n_heads, dtype=torch.float)
    fit(
        objective,
        heads,
        lambda module, batch: module(batch, weights),
        records,
        medusa_config.to_dict(),
        medusa_config.n_heads,
        config,
        out_dir,
        model_name,
        progress,
    )
    return heads


def save_medusa(
    heads: MedusaHeads, path: Path, info: dict[str, object], dtype: torch.dtype = torch.float32
) -> None:
    save_weights(heads, path, "medusa_config", heads.config.to_dict(), info, dtype)


def load_medusa(
    path: Path, model: Transformer, dtype: torch.dtype | None = None
) -> tuple[MedusaHeads, dict[str, object]]:
    """Heads saved by `save_medusa`, in the model's dtype (or `dtype`:
    float32 to train them further), plus their `info` metadata."""
    return load_drafter(
        path,
        "medusa_config",
        "Medusa heads",
        lambda c: MedusaHeads(model.config, MedusaConfig(**c)),
        dtype or model.dtype,
    )


def medusa_for_drafting(
    path: Path, model: Transformer, dtype: torch.dtype
) -> MedusaHeads | Int8MedusaHeads:
    """Heads saved by `save_medusa`, ready to draft with weights in `dtype` (`torch.qint8`:
    int8 LM heads)."""
    if dtype == torch.qint8:
        return Int8MedusaHeads(load_medusa(path, model, torch.float32)[0])
    return load_medusa(path, model, dtype)[0]
