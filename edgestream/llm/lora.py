"""Low-rank adapters (LoRA, Hu et al., 2021) on the decoder's linear layers, and merging them.

Shared-mode Speculative Streaming fine-tunes the base model together with its streams; LoRA
keeps that fine-tune small (an adapter file of a few MB) and cheap to train on a CPU. For
decoding, the adapters are merged into the weights (W + scale * B A) and the model is packed
again, so a fine-tuned model decodes exactly as fast as the base.

The adapters sit on every block's fused projections (q/k/v, output, gate/up, down); the
embedding and the tied LM head stay frozen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from edgestream.llm.model import Transformer

TARGETS = ("attention.wqkv", "attention.wo", "feed_forward.w_gate_up", "feed_forward.w_down")


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 16
    alpha: float = 32.0  # the update is scaled by alpha / rank

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got {self.rank}, {self.alpha}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable rank-r update, zero at initialisation."""

    def __init__(self, base: nn.Linear, config: LoRAConfig) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError("LoRA needs plain nn.Linear layers: load the model with pack=False")
        self.base = base.requires_grad_(False)
        self.scale = config.alpha / config.rank
        # float32 adapters on a bfloat16 base: the optimiser's updates stay precise.
        self.down = nn.Parameter(torch.randn(config.rank, base.in_features) / base.in_features**0.5)
        self.up = nn.Parameter(torch.zeros(base.out_features, config.rank))

    def forward(self, x: Tensor) -> Tensor:
        update = (x.float() @ self.down.T) @ self.up.T
        return self.base(x) + (self.scale * update).to(x.dtype)

    def merged(self) -> nn.Linear:
        """The plain layer with the update folded into its weight."""
        weight = self.base.weight.float() + self.scale * (self.up @ self.down)
        linear = nn.Linear(self.base.in_features, self.base.out_features, bias=False)
        linear.weight = nn.Parameter(weight.to(self.base.weight.dtype), requires_grad=False)
        return linear


def add_lora(model: Transformer, config: LoRAConfig) -> nn.ModuleDict:
    """Wrap every target layer of `model` in place; returns the adapters by layer name."""
    adapters = nn.ModuleDict()
    for i, block in enumerate(model.layers):
        for target in TARGETS:
            parent_name, name = target.split(".")
            parent = getattr(block, parent_name)
            wrapped = LoRALinear(getattr(parent, name), config)
            setattr(parent, name, wrapped)
            adapters[f"{i}_{parent_name}_{name}"] = wrapped
    return adapters


def adapter_weights(adapters: nn.ModuleDict) -> dict[str, Tensor]:
    """Only the trained tensors (not the frozen base weights inside each wrapper)."""
    return {
        f"{key}.{part}": getattr(module, part)
        for key, module in adapters.items()
        for part in ("down", "up")
    }


def merge_lora(model: Transformer) -> Transformer:
    """Replace every `LoRALinear` in `model` by its merged plain layer, in place."""
    for block in model.layers:
        for target in TARGETS:
            parent_name, name = target.split(".")
            parent = getattr(block, parent_name)
            layer = getattr(parent, name)
            if isinstance(layer, LoRALinear):
                setattr(parent, name, layer.merged())
    return model
