"""4-bit linear layers: the GGUF's own Q4_1 weights through PyTorch's int4 CPU kernel.

SmolLM2 ships as a Q4_1 GGUF: every linear weight is stored as blocks of 32 input columns,
each value `q * d + m` with q in 0..15 and one (d, m) pair of float16 numbers per block. The
float32 engine dequantises those blocks and reads 4 bytes a weight; `--dtype q4_1` keeps the
blocks and reads about 5 bits a weight (4 + 32 bits of scale per 32 weights), which is what a
decode step on a CPU is bound by.

The kernel (`aten._weight_int4pack_mm_for_cpu`) takes bfloat16 inputs and scales: each row's
input is rounded to bfloat16 and each block's (d, m) too, and the products are summed in
float32. Everything else (residual stream, norms, attention, LM head) stays float32, and a
prompt of 128 tokens or more is multiplied in float32 by the dequantised blocks (`Int4Linear`
says why). So q4_1 output is not float32's token for token: it is a precision of its own,
like bfloat16. Nor is speculative decoding under q4_1 token for token q4_1's autoregressive
decoding, although the kernel computes each row on its own: attention over several query
rows sums in another order than over one (float32 differences of ~1e-7, harmless in float32),
and rounding the next layer's input to bfloat16 can magnify one to ~0.1 of a logit, enough to
flip a near-tie.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

GROUP = 32  # input columns per block, Q4_1's and the kernel's group size
OUT_MULTIPLE = 16  # the kernel's packing needs output rows in multiples of 16
BLOCK_BYTES = 20  # Q4_1 block: float16 d, float16 m, 16 bytes of 4-bit values


def int4_available() -> bool:
    """Whether this PyTorch build has the int4 CPU kernel that q4_1 runs on."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass(frozen=True)
class Q4_1:
    """One weight matrix in Q4_1 blocks: weight[o, i] = q[o, i] * d[o, i // 32] + m[o, i // 32]."""

    q: Tensor  # (out, in) uint8 in 0..15
    d: Tensor  # (out, in / 32) float32 scales
    m: Tensor  # (out, in / 32) float32 block minima

    def dequantised(self) -> Tensor:
        """The float32 (out, in) weight the blocks stand for, as GGUF readers compute it."""
        out_features, in_features = self.q.shape
        weight = self.q.reshape(out_features, in_features // GROUP, GROUP).float()
        return _scaled(weight, self.d, self.m)

    @classmethod
    def quantise(cls, weight: Tensor) -> Q4_1:
        """Blocks for a float weight, by ggml's rule: d = (max - min) / 15, m = min, q rounded.

        For weights that have no Q4_1 blocks of their own (a float model, another GGUF type).
        """
        out_features, in_features = weight.shape
        blocks = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
        low, high = blocks.amin(-1), blocks.amax(-1)
        # Stored as float16 in a GGUF file: round the same way so a requantised weight is one
        # a Q4_1 file could hold.
        d = ((high - low) / 15).half().float()
        m = low.half().float()
        inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        q = ((blocks - m[..., None]) * inverse[..., None]).round().clamp(0, 15)
        return cls(q.to(torch.uint8).reshape(out_features, in_features), d, m)

    @classmethod
    def cat(cls, parts: list[Q4_1]) -> Q4_1:
        """The blocks of the weights stacked by output rows (fused q/k/v or gate/up)."""
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d", "m")))

    def rows_permuted(self, order: Tensor) -> Q4_1:
        return Q4_1(self.q[order], self.d[order], self.m[order])


def _scaled(q: Tensor, d: Tensor, m: Tensor) -> Tensor:
    """q * d + m per block for float q of any shape holding (out, in) values, in place.

    Why in place: fresh temporaries the size of a weight made dequantising all of SmolLM2's
    blocks take 0.5 s instead of 0.03-0.09 s here (the cost of their new pages)."""
    out_features, groups = d.shape
    blocks = q.view(out_features, groups, GROUP).mul_(d[..., None]).add_(m[..., None])
    return blocks.view(out_features, groups * GROUP)


class Int4Linear(nn.Module):
    """y = x W^T with W held as Q4_1 blocks.

    Fewer than MANY_ROWS rows (a decode step, a draft tree) go through the int4 kernel, their
    inputs rounded to bfloat16. Its cost grows with the rows (8 cost 3.6x one), so a prompt's
    prefill multiplies float32 inputs by the blocks dequantised on the fly instead, which are
    exactly the float32 engine's weights. Measured across SmolLM2's 120 linears (2 threads, AVX2
    only): 64 rows 240 ms in the kernel against 322 ms dequantised, 128 rows 445 against 453;
    a 300-token prefill 1.17 s in the kernel alone, 0.76 s with this split, 0.65 s in float32.
    For that the layer also keeps the 4-bit values two to a byte and the scales in float32.
    """

    MANY_ROWS = 128

    def __init__(self, blocks: Q4_1) -> None:
        super().__init__()
        if not int4_available():
            raise ValueError("--dtype q4_1 needs PyTorch's int4 CPU kernel, absent in this build")
        self.out_features, self.in_features = blocks.q.shape
        check_shape(self.in_features, self.out_features)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.q.to(torch.int32).contiguous(), 1
        )
        # The kernel computes (q - 8) * scale + zero per block; Q4_1 is q * d + m.
        zero = blocks.m + 8 * blocks.d
        self.scale_zero = torch.stack([blocks.d.T, zero.T], dim=-1).to(torch.bfloat16).contiguous()
        q = blocks.q.to(torch.uint8)
        self.nibbles = q[:, 0::2] | (q[:, 1::2] << 4)  # (out, in / 2)
        self.d, self.m = blocks.d, blocks.m

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) float -> (..., out) float32; the kernel takes 2-d inputs only."""
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= self.MANY_ROWS:
            y = F.linear(rows.float(), self.plain_weight())
        else:
            rows = rows.to(torch.bfloat16)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows, self.packed, GROUP, self.scale_zero
            ).float()
        return y.reshape(*x.shape[:-1], self.out_features)

    def plain_weight(self) -> Tensor:
        """The float32 (out, in) weight the blocks stand for (prefill, drafting copies)."""
        weight = torch.empty(self.out_features, self.in_features // 2, 2)
        weight[..., 0].copy_(self.nibbles & 0x0F)
        weight[..., 1].copy_(self.nibbles >> 4)
        return _scaled(weight, self.d, self.m)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, q4_1"


def check_shape(in_features: int, out_features: int) -> None:
    if in_features % GROUP or out_features % OUT_MULTIPLE:
        raise ValueError(
            f"--dtype q4_1 needs linear layers with inputs in multiples of {GROUP} and outputs "
            f"in multiples of {OUT_MULTIPLE}; this model has one of {in_features} -> {out_features}"
        )


def read_q4_1(gguf: Path) -> dict[str, Q4_1]:
    """Every Q4_1 tensor of a GGUF file, by its GGUF name, in (out, in) layout."""
    from gguf import GGMLQuantizationType, GGUFReader

    tensors = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or len(tensor.shape) != 2:
            continue
        in_features, out_features = (int(n) for n in tensor.shape)  # GGUF lists dims inner first
        raw = np.asarray(tensor.data).reshape(-1, BLOCK_BYTES)  # one block a row
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
        nibbles = raw[:, 4:]
        # Byte j holds value j in its low half and value j + 16 in its high half.
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)
        tensors[tensor.name] = Q4_1(
            torch.from_numpy(q.reshape(out_features, in_features)),
            torch.from_numpy(d.reshape(out_features, in_features // GROUP)),
            torch.from_numpy(m.reshape(out_features, in_features // GROUP)),
        )
    return tensors


def rope_row_order(rows: int, heads: int) -> Tensor:
    """Row order that undoes llama.cpp's converter, which interleaves each head's query/key
    rows for its RoPE; transformers undoes it when it loads a GGUF, so its rows are these."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def _gguf_blocks(gguf: dict[str, Q4_1], layer: int, config: object) -> dict[str, Q4_1 | None]:
    """The GGUF's blocks for one decoder layer's fused linears (None where any part is missing)."""

    def part(name: str, heads: int | None = None) -> Q4_1 | None:
        blocks = gguf.get(f"blk.{layer}.{name}.weight")
        if blocks is None or heads is None:
            return blocks
        return blocks.rows_permuted(rope_row_order(blocks.q.shape[0], heads))

    def fused(*parts: Q4_1 | None) -> Q4_1 | None:
        return None if any(p is None for p in parts) else Q4_1.cat(list(parts))

    return {
        "attention.wqkv": fused(
            part("attn_q", config.n_heads), part("attn_k", config.n_kv_heads), part("attn_v")
        ),
        "attention.wo": part("attn_output"),
        "feed_forward.w_gate_up": fused(part("ffn_gate"), part("ffn_up")),
        "feed_forward.w_down": part("ffn_down"),
    }


def use_q4_1_linears(model: nn.Module, gguf: Path | None = None) -> int:
    """Replace every decoder layer's linears of a plain float32 `Transformer` by `Int4Linear`s,
    in place. The LM head stays as it is (SmolLM2's is Q8_0, not Q4_1).

    Blocks come from `gguf` where it holds a layer's weights as Q4_1 *and* they dequantise to
    exactly the model's weight (a check that the rows were matched up right); other weights are
    quantised here. Returns how many linears took the file's blocks.
    """
    stored = read_q4_1(gguf) if gguf is not None and gguf.suffix == ".gguf" else {}
    from_file = 0
    for index, block in enumerate(model.layers):
        for name, blocks in _gguf_blocks(stored, index, model.config).items():
            parent_name, attribute = name.split(".")
            parent = getattr(block, parent_name)
            linear = getattr(parent, attribute)
            if not isinstance(linear, nn.Linear):
                raise TypeError("use_q4_1_linears needs the plain model, before pack_weights()")
            weight = linear.weight.detach().float()
            check_shape(linear.in_features, linear.out_features)
            if blocks is not None and torch.equal(blocks.dequantised(), weight):
                from_file += 1
            else:
                blocks = Q4_1.quantise(weight)
            setattr(parent, attribute, Int4Linear(blocks))
    return from_file
