"""Shared mode: fine-tune the base model (LoRA) and its speculative streams together on a task.

The paper's second mode. Lossless mode makes a frozen model faster; shared mode also adapts the
model to a task, with loss = CE(next token) + sum_j alpha * CE(stream j, token t+1+j) on the
task's own training data (prompt, then the reference answer; loss on the answer only). The
streams learn to predict the *fine-tuned* model's continuation, which teacher-forced task data
makes easier to foresee than a general model's, so they are accepted more often.

Design choice: the main stream does not attend to the streams, as in lossless mode. Then one
implementation serves both modes and decoding stays exactly the fine-tuned model's greedy output
(`generate_ss` is unchanged); the paper allows either.

The same code trains the baseline it is compared with: LoRA with the next-token loss only
(`with_streams=False`), same data, steps and adapters. An adapter file holds the LoRA tensors
and, in shared mode, the streams; `load_adapter` merges the LoRA into the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.loading import LanguageModel
from edgestream.llm.lora import LoRAConfig, adapter_weights, add_lora, merge_lora
from edgestream.llm.model import Transformer, can_pack_weights
from edgestream.llm.msa import (
    SpeculativeStreams,
    StreamConfig,
    adapter_for,
    stream_inputs,
    stream_layer,
)
from edgestream.llm.tasks import TaskPrompt
from edgestream.llm.train import (
    IGNORE,
    Batch,
    ProgressFn,
    TrainConfig,
    draft_targets,
    fit,
    new_or_given_streams,
)


def next_token_record(category: str, tokens: list[int], prompt_length: int, dim: int) -> dict:
    """A training sequence for `train_shared`: the next-token loss covers every token from
    position `prompt_length` on. No captured states: the whole model trains."""
    return {
        "category": category,
        "tokens": torch.tensor(tokens),
        "prompt_length": prompt_length,
        "split_hidden": torch.zeros(0, dim),
    }


def task_records(
    lm: LanguageModel, prompts: list[TaskPrompt], max_answer_tokens: int
) -> list[dict]:
    """Training sequences: the chat-formatted prompt, then the reference answer and a stop token."""
    stop = min(lm.stop_ids)
    records = []
    for p in prompts:
        if not p.reference:
            continue
        prompt = lm.encode_prompt(p.prompt)
        answer = lm.tokenizer.encode(p.reference.strip(), add_special_tokens=False)
        tokens = prompt + answer[:max_answer_tokens] + [stop]
        records.append(next_token_record(p.category, tokens, len(prompt), lm.model.config.dim))
    if not records:
        raise ValueError("no training sequences: the task's prompts have no reference answers")
    return records


class SharedObjective(nn.Module):
    """CE(next token) on answer positions + stream_weight * sum_j CE(stream j) at sampled ones."""

    def __init__(self, model: Transformer, streams: SpeculativeStreams | None) -> None:
        super().__init__()
        self.model = model
        self.streams = streams
        if streams is not None:
            ids = streams.draft_vocab
            self.register_buffer(
                "head_weight", model.lm_head_weight()[ids].detach(), persistent=False
            )
            lookup = torch.full((model.config.vocab_size,), IGNORE, dtype=torch.long)
            lookup[ids] = torch.arange(len(ids))
            self.register_buffer("target_index", lookup, persistent=False)

    def forward(self, batch: Batch, stream_weight: float) -> tuple[Tensor, Tensor, Tensor]:
        """Returns (loss, top-1 hits, labels): index 0 the main stream, then each stream."""
        model, streams = self.model, self.streams
        tokens = batch.tokens.clamp(min=0)  # padding sits after each sequence: causal is enough
        B, L = tokens.shape
        cache = model.new_cache(L, batch_size=B)
        slots = torch.arange(L)
        mask = (slots[None, :] <= slots[:, None])[None, None]
        rope = model.rope(slots.expand(B, L), model.dtype)
        x, s = model.tok_embeddings(tokens), None
        for i, block in enumerate(model.layers):
            if streams is not None and i == streams.split:
                start = x.gather(1, batch.positions[:, :, None].expand(-1, -1, x.shape[-1]))
                next_tokens = tokens.gather(1, batch.positions + 1) if streams.token_aware else None
                node_mask = mask[0, 0][batch.positions][:, None]
                s, srope, smask = stream_inputs(
                    model, streams, start, batch.positions, node_mask, next_tokens
                )
            x = block(x, rope, mask, cache, i)
            if s is not None:
                s = stream_layer(block, adapter_for(streams, i), s, srope, smask, cache, i, L)
        # The next-token loss on every answer position (from the last prompt token on).
        next_targets = torch.cat([batch.tokens[:, 1:], torch.full((B, 1), IGNORE)], dim=1)
        in_answer = slots[None, :] >= batch.prompt_lengths[:, None] - 1
        next_targets = torch.where(in_answer, next_targets, IGNORE)
        rows = next_targets != IGNORE
        main_logits = model.output(model.norm(x[rows])).float()
        loss = F.cross_entropy(main_logits, next_targets[rows])
        hits = [(main_logits.argmax(-1) == next_targets[rows]).sum()]
        labelled = [rows.sum()]
        if s is not None:
            gamma = streams.config.n_streams
            logits = (
                F.linear(model.norm(s), self.head_weight)
                .float()
                .view(B, -1, gamma, len(self.head_weight))
            )
            targets, ok = draft_targets(batch.targets, self.target_index)
            for j in range(gamma):
                ce = F.cross_entropy(
                    logits[:, :, j].flatten(0, 1),
                    targets[:, :, j].flatten(),
                    ignore_index=IGNORE,
                    reduction="sum",
                ) / ok[:, :, j].sum().clamp(min=1)
                loss = loss + stream_weight * ce
                hits.append(((logits[:, :, j].argmax(-1) == targets[:, :, j]) & ok[:, :, j]).sum())
                labelled.append(ok[:, :, j].sum())
        return loss, torch.stack(hits).detach(), torch.stack(labelled)


class SharedWeights(nn.Module):
    """Everything shared mode trains: the LoRA adapters and (optionally) the streams."""

    def __init__(self, adapters: nn.ModuleDict, streams: SpeculativeStreams | None) -> None:
        super().__init__()
        self.lora = adapters
        self.streams = streams


def train_shared(
    model: Transformer,
    records: list[dict],
    lora_config: LoRAConfig,
    stream_config: StreamConfig | None,
    config: TrainConfig,
    out_dir: Path,
    model_name: str,
    progress: ProgressFn | None = None,
    init_streams: SpeculativeStreams | None = None,
    init_lora: dict[str, Tensor] | None = None,
) -> SharedWeights:
    """Fine-tune `model` (unpacked; LoRA is added in place) with or without streams.

    `init_streams` (e.g. lossless streams trained for the base model) start the streams where
    they already draft well, instead of from scratch; they replace `stream_config`.
    `init_lora` (an adapter's LoRA tensors, from `read_adapter`, of `lora_config`'s rank)
    starts the adapters where an earlier run left them instead of at zero: continuing it on
    new text costs a fraction of training again.
    """
    torch.manual_seed(config.seed)
    model.requires_grad_(False)
    adapters = add_lora(model, lora_config)
    if init_lora is not None:
        _copy_lora(adapters, init_lora)
    streams = None
    if init_streams is not None or stream_config is not None:
        streams = new_or_given_streams(model, stream_config, records, init_streams)
        stream_config = streams.config
    weights = SharedWeights(adapters, streams)
    objective = SharedObjective(model, streams)
    settings = {"lora": lora_config.to_dict(), "streams": stream_config and stream_config.to_dict()}
    depth = stream_config.n_streams if stream_config else 1
    fit(
        objective,
        weights,
        lambda module, batch: module(batch, config.stream_weight),
        records,
        settings,
        depth,
        config,
        out_dir,
        model_name,
        progress,
    )
    return weights


def save_adapter(weights: SharedWeights, lora_config: LoRAConfig, path: Path, info: dict) -> None:
    """LoRA tensors (prefixed `lora.`) and stream tensors (`streams.`) in one safetensors file."""
    from safetensors.torch import save_file

    tensors = {
        f"lora.{k}": v.detach().float().contiguous()
        for k, v in adapter_weights(weights.lora).items()
    }
    metadata = {"lora_config": json.dumps(lora_config.to_dict()), "info": json.dumps(info)}
    if weights.streams is not None:
        for k, v in weights.streams.state_dict().items():
            tensors[f"streams.{k}"] = v.detach().float().contiguous()
        metadata["stream_config"] = json.dumps(weights.streams.config.to_dict())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


@dataclass(frozen=True)
class AdapterFile:
    """An adapter file's contents, unmerged."""

    lora: dict[str, Tensor]  # by `adapter_weights` name
    lora_config: LoRAConfig
    streams: dict[str, Tensor]  # a `SpeculativeStreams` state dict; empty without streams
    stream_config: StreamConfig | None
    info: dict


def read_adapter(path: str | Path) -> AdapterFile:
    """Read an adapter file written by `save_adapter`, refusing anything else by name."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"adapter {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        lora_config = LoRAConfig(**json.loads(metadata["lora_config"]))
        stream_settings = metadata.get("stream_config")
        stream_config = StreamConfig(**json.loads(stream_settings)) if stream_settings else None
        info = json.loads(metadata.get("info", "{}"))
    except (SafetensorError, KeyError, json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path} is not an adapter file: {err}") from err
    return AdapterFile(
        lora={k.removeprefix("lora."): v for k, v in tensors.items() if k.startswith("lora.")},
        lora_config=lora_config,
        streams={
            k.removeprefix("streams."): v for k, v in tensors.items() if k.startswith("streams.")
        },
        stream_config=stream_config,
        info=info,
    )


def _copy_lora(adapters: nn.ModuleDict, lora: dict[str, Tensor]) -> None:
    """Load `lora` into freshly added adapters; ValueError if names or shapes differ."""
    expected = adapter_weights(adapters)
    if lora.keys() != expected.keys() or any(lora[k].shape != v.shape for k, v in expected.items()):
        raise ValueError("the adapter does not fit this model (adapter names or shapes differ)")
    for key, tensor in expected.items():
        tensor.data.copy_(lora[key])


def load_adapter(path: str | Path, lm: LanguageModel) -> tuple[SpeculativeStreams | None, dict]:
    """Merge an adapter's LoRA into `lm.model` (which must be loaded with pack=False; packed
    again here) and return its streams (None for a next-token-only adapter) and info."""
    adapter = read_adapter(path)
    model = lm.model
    if not all(isinstance(block.attention.wqkv, nn.Linear) for block in model.layers):
        raise ValueError("an adapter merges into plain weights: load the model with pack=False")
    adapters = add_lora(model, adapter.lora_config)
    try:
        _copy_lora(adapters, adapter.lora)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    finally:
        merge_lora(model)  # zero updates where nothing was loaded: the model stays the base
    if can_pack_weights():
        model.pack_weights()
    streams = None
    if adapter.stream_config is not None:
        streams = SpeculativeStreams(model.config, adapter.stream_config)
        streams.load_state_dict(adapter.streams)
        streams = streams.to(model.dtype).eval().requires_grad_(False)
    return streams, adapter.info
