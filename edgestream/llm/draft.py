"""A small draft model for two-model speculative decoding (Leviathan et al., 2023).

The baseline Speculative Streaming removes: a second, smaller model that shares the base
model's tokenizer drafts a few tokens one by one, and the base model verifies them in one pass.
SmolLM2 has no smaller sibling in our offline world, so the draft is distilled here: the base
model's first `n_layers` decoder layers, its final norm and its (tied) embedding and LM head,
with the layers and norm trained on the same self-distilled answers as the streams to predict
the base model's next token. The embedding stays frozen and shared, so a draft file stores only
its layers.

`generate_draft` lives in `baselines`; `train_draft` uses the same loop as the streams.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.int8 import quantise_linears
from edgestream.llm.model import Block, PackedLinear, Transformer
from edgestream.llm.train import IGNORE, Batch, ProgressFn, TrainConfig, fit
from edgestream.llm.weights_file import load_into, read_weights, save_weights


def truncated_copy(base: Transformer, n_layers: int, copy_layers: bool = True) -> Transformer:
    """A new model with base's first n_layers layers and final norm (copied when copy_layers)
    and base's embedding and LM head modules (shared, not copied), in base's dtype."""
    if not 1 <= n_layers < base.config.n_layers:
        raise ValueError(f"n_layers must be in [1, {base.config.n_layers - 1}], got {n_layers}")
    config = dataclasses.replace(base.config, n_layers=n_layers)
    with torch.device("meta"):  # the shared modules are replaced below: never allocate them
        draft = Transformer(config)
    draft.tok_embeddings, draft.output = base.tok_embeddings, base.output
    draft.layers = nn.ModuleList(
        copy.deepcopy(base.layers[i]) if copy_layers else _empty_block(base)
        for i in range(n_layers)
    )
    draft.norm = copy.deepcopy(base.norm)
    draft.rope = base.rope
    return draft


def _empty_block(base: Transformer) -> nn.Module:
    """A plain (unpacked) block of base's shape and dtype, to load trained weights into."""
    return Block(base.config).to(base.dtype)


class DraftWeights(nn.Module):
    """The trained part of a draft model, as one module (for the optimiser and checkpoints)."""

    def __init__(self, draft: Transformer) -> None:
        super().__init__()
        self.layers = draft.layers
        self.norm = draft.norm


class DraftObjective(nn.Module):
    """Cross-entropy of the draft's next-token prediction at the sampled answer positions."""

    def __init__(self, draft: Transformer) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        tokens = batch.tokens.clamp(min=0)  # padding (after each sequence) is never a target
        B, L = tokens.shape
        cache = self.draft.new_cache(L, batch_size=B)
        hidden = self.draft.hidden_states(tokens, cache)  # causal: padding sits at the end
        index = batch.positions[:, :, None].expand(-1, -1, hidden.shape[-1])
        logits = self.draft.output(hidden.gather(1, index)).float()  # (B, n, vocab)
        targets = batch.tokens.gather(1, batch.positions + 1)
        # Padded position slots (beyond a short sequence's samples) carry no stream-1 label.
        targets = torch.where(batch.targets[:, :, 0] == IGNORE, IGNORE, targets)
        labelled = targets != IGNORE
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        hits = ((logits.argmax(-1) == targets) & labelled).sum()
        return loss, hits[None].detach(), labelled.sum()[None]


def train_draft(
    base: Transformer,
    records: list[dict],
    n_layers: int,
    config: TrainConfig,
    out_dir: Path,
    model_name: str,
    progress: ProgressFn | None = None,
) -> Transformer:
    """Distil (or resume distilling) a draft model; see `train.fit`."""
    if not records:
        raise ValueError("no training sequences")
    draft = truncated_copy(base, n_layers)
    draft.requires_grad_(False)
    weights = DraftWeights(draft).requires_grad_(True)
    # The draft reads tokens only: drop the captured states that make_batch would copy.
    records = [{**r, "split_hidden": r["split_hidden"][:0]} for r in records]
    objective = DraftObjective(draft)
    fit(
        objective,
        weights,
        lambda module, batch: module(batch),
        records,
        {"n_layers": n_layers},
        1,
        config,
        out_dir,
        model_name,
        progress,
    )
    return draft.eval().requires_grad_(False)


def save_draft(draft: Transformer, path: Path, info: dict[str, object]) -> None:
    save_weights(
        DraftWeights(draft), path, "draft_config", {"n_layers": draft.config.n_layers}, info
    )


def load_draft(
    path: Path, base: Transformer, int8: bool = False
) -> tuple[Transformer, dict[str, object]]:
    """A draft saved by `save_draft`, sharing base's embedding, in base's dtype; with `int8`,
    its linear layers (its LM head too: most of its bytes) draft through int8 weights
    (`int8.Int8Linear`), as the streams and Medusa heads do under `--draft-dtype int8`."""
    tensors, settings, info = read_weights(path, "draft_config", "draft model")
    n_layers = settings.get("n_layers")
    if not isinstance(n_layers, int) or not 1 <= n_layers < base.config.n_layers:
        raise ValueError(f"{path} is not a draft model for this base model")
    draft = truncated_copy(base, n_layers, copy_layers=False)
    load_into(DraftWeights(draft), {k: v.to(base.dtype) for k, v in tensors.items()}, path)
    if int8:
        quantise_linears(draft)
    elif isinstance(base.output, PackedLinear):  # a packed base: pack the draft's layers too
        draft.pack_weights()
    return draft.eval().requires_grad_(False), info
