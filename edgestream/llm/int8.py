"""Int8 linear layers for drafters: weights quantised once per output channel, each call's
input quantised on the fly (fbgemm's dynamic int8 linear).

Why drafters and only drafters: a draft pass pushes a handful of rows through layers whose
weights the verification pass has just pushed out of the CPU cache, so its cost is reading
those weights, and int8 reads a quarter of float32's bytes. The input is quantised with one
scale for all rows, so a row's result depends on the other rows: fine for a draft, which
decides only what is verified, never for the verification itself, whose every row must score
as the autoregressive decoder's single row does (docs/benchmarks.md, "A cheaper LM head").
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from edgestream.llm.model import PackedLinear

# Quantised engines whose int8 drafting was measured to pay (x86: fbgemm plus oneDNN).
MEASURED_ENGINES = ("x86", "fbgemm")


def int8_available() -> bool:
    """Whether this PyTorch build has a quantised engine that runs dynamic int8 linears."""
    return torch.backends.quantized.engine in (*MEASURED_ENGINES, "qnnpack", "onednn")


def int8_measured() -> bool:
    """Whether int8 drafting was measured faster than float32 on this kind of engine."""
    return torch.backends.quantized.engine in MEASURED_ENGINES


class Int8Linear(nn.Module):
    """y = x W^T for float32 x with W stored in int8, one scale per output row (symmetric)."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        if not int8_available():
            raise ValueError("this PyTorch build has no quantised engine for int8 drafting")
        weight = weight.detach().float()
        out_features, in_features = weight.shape
        self.in_features, self.out_features = in_features, out_features
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        # PyTorch 2.13 warns that creating quantised tensors is deprecated; the pinned version
        # still needs one to pack fbgemm's weights, and there is no other fast int8 kernel here
        # (`_weight_int8pack_mm` and `_int_mm` measured 5-30x slower than float32).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            quantised = torch.quantize_per_channel(
                weight, scales, torch.zeros(out_features, dtype=torch.long), 0, torch.qint8
            )
            self.linear = torch.ao.nn.quantized.dynamic.Linear(
                in_features, out_features, bias_=False, dtype=torch.qint8
            )
            self.linear.set_weight_bias(quantised, None)

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> float32 (..., out); the kernel takes 2-d inputs only."""
        rows = x.reshape(-1, self.in_features).float()
        return self.linear(rows).reshape(*x.shape[:-1], self.out_features)


def quantise_linears(module: nn.Module) -> nn.Module:
    """Replace the float linear layers among `module`'s descendants by `Int8Linear`s, in place.

    Only attributes are reassigned, so a layer that `module` shares with another model is
    replaced in `module` alone when it is `module`'s own child (a draft model's LM head)."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, PackedLinear):
                setattr(parent, name, Int8Linear(child.plain_weight()))
            elif isinstance(child, nn.Linear) and child.bias is None:
                setattr(parent, name, Int8Linear(child.weight))
    return module
