"""Self-distilled training data for the speculative streams.

In lossless mode the streams must predict what the frozen base model itself would say, so the
targets are the base model's own greedy answers to task prompts (train splits only). While the
answers are generated, the main stream's hidden states entering the first MSA layer are captured
for every position (a forward hook on the layer below it): the frozen lower layers never need to
run again during training, which is most of the CPU budget saved.

Output: shards, each a list of sequence dicts, written atomically (temporary file, then
rename). A shard's file name is a digest of what it was made from (model, split layer, answer
length, its prompts), so an interrupted run resumes where it stopped, a run with more prompts
distils only the new ones, and a shard made from other prompts or settings is never mistaken
for this run's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from edgestream.llm.engine import generate_batch_greedy
from edgestream.llm.loading import LanguageModel
from edgestream.llm.tasks import TaskPrompt


class SplitCapture:
    """Records the output of decoder layer `split - 1` (the MSA layers' input) on every call."""

    def __init__(self, lm: LanguageModel, split: int) -> None:
        if not 1 <= split <= lm.model.config.n_layers:
            raise ValueError(f"split must be in [1, {lm.model.config.n_layers}], got {split}")
        self.chunks: list[Tensor] = []  # (B, T, dim) per forward call
        layer = lm.model.layers[split - 1]
        self.handle = layer.register_forward_hook(lambda _m, _in, out: self.chunks.append(out))

    def close(self) -> None:
        self.handle.remove()


def _rows_from_chunks(chunks: list[Tensor], pads: list[int], lengths: list[int]) -> list[Tensor]:
    """Per-row hidden states (length_b, dim) from a left-padded prefill plus decode steps."""
    full = torch.cat(chunks, dim=1)  # (B, P + steps, dim)
    return [
        full[b, pad : pad + n].clone()
        for b, (pad, n) in enumerate(zip(pads, lengths, strict=False))
    ]


def distill_batch(
    lm: LanguageModel, prompts: list[TaskPrompt], split: int, max_new_tokens: int
) -> list[dict]:
    """Greedy answers plus captured split-layer states for one batch of prompts."""
    encoded = [lm.encode_prompt(p.prompt) for p in prompts]
    capture = SplitCapture(lm, split)
    try:
        answers = generate_batch_greedy(lm.model, encoded, max_new_tokens, lm.stop_ids)
    finally:
        capture.close()
    P = max(len(e) for e in encoded)
    pads = [P - len(e) for e in encoded]
    # The last generated token is never fed back, so its state does not exist; drop it.
    lengths = [len(e) + len(a) - 1 for e, a in zip(encoded, answers, strict=False)]
    states = _rows_from_chunks(capture.chunks, pads, lengths)
    return [
        {
            "category": p.category,
            "tokens": torch.tensor(e + a),
            "prompt_length": len(e),
            "split_hidden": h.to(torch.bfloat16),
        }
        for p, e, a, h in zip(prompts, encoded, answers, states, strict=False)
    ]


def prompt_batches(prompts: list[TaskPrompt], batch_size: int, sort_block: int) -> list[list[int]]:
    """Prompt indices in batches. Similar lengths batch together, so little compute goes to
    padding; sorting only within consecutive blocks keeps the batches of a prompt list's
    beginning unchanged when prompts are appended (a task mix with more prompts per task
    starts with the smaller mix), so their shards are reused."""
    batches = []
    for start in range(0, len(prompts), sort_block):
        block = range(start, min(start + sort_block, len(prompts)))
        order = sorted(block, key=lambda i: len(prompts[i].prompt))
        batches.extend(order[i : i + batch_size] for i in range(0, len(order), batch_size))
    return batches


def _digest(lm: LanguageModel, prompts: list[TaskPrompt], split: int, max_new_tokens: int) -> str:
    """What a shard is made from, as a short hex digest: its file name."""
    made_from = [lm.name, str(lm.model.dtype), split, max_new_tokens, [p.prompt for p in prompts]]
    return hashlib.sha1(json.dumps(made_from).encode()).hexdigest()[:16]


def distill(
    lm: LanguageModel,
    prompts: list[TaskPrompt],
    out_dir: Path,
    split: int,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    sort_block: int = 1024,
    progress: Callable[[int, int], None] | None = None,
    rank: int = 0,
    world: int = 1,
) -> list[Path]:
    """Write shards of distilled sequences to out_dir; existing shards are kept (resume).

    Under several processes, rank r writes shards r, r + world, ...; the caller waits for all
    (a barrier) before reading them. Returns every shard's path. Prompts are sorted by length
    within consecutive blocks of `sort_block` (see `prompt_batches`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = prompt_batches(prompts, batch_size, sort_block)
    shards = []
    for index, batch in enumerate(batches):
        batch_prompts = [prompts[i] for i in batch]
        shard = out_dir / f"shard-{_digest(lm, batch_prompts, split, max_new_tokens)}.pt"
        shards.append(shard)
        if index % world == rank and not shard.exists():
            records = distill_batch(lm, batch_prompts, split, max_new_tokens)
            tmp = shard.with_suffix(".tmp")
            torch.save(records, tmp)
            os.replace(tmp, shard)
        if progress is not None:
            progress(index + 1, len(batches))
    return shards


def shards_in(run: Path, split: int) -> list[Path]:
    """An earlier run's distilled shards captured at layer `split` (its `distill-at-{split}`),
    so a new run can train on them too; refused when it holds none."""
    folder = run / f"distill-at-{split}"
    shards = sorted(folder.glob("shard-*.pt"))
    if not shards:
        raise ValueError(
            f"{run} holds no distilled answers captured at layer {split} (no {folder}/shard-*.pt):"
            " replay a run distilled with the same --capture-layers"
        )
    return shards


def load_shards(paths: list[Path]) -> list[dict]:
    records: list[dict] = []
    for path in paths:
        records.extend(torch.load(path, weights_only=True))
    return records
