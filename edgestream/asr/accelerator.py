"""The Conformer-CTC reshaped for neural accelerators, following Apple's published principles
for the Neural Engine (ml-ane-transformers) as the edge Conformer paper does.

What changes, and why:
- Activations are channels-first 4-D, (B, C, 1, S): the layout whose last axis (sequence) is
  contiguous and whose channel axis the accelerator tiles; no reshapes between layers.
- Every nn.Linear becomes a 1x1 nn.Conv2d with the same weights, so each projection is one
  convolution over that layout.
- Attention is split per head with `Tensor.split` along channels and computed with einsum, with
  one transpose, on K; no (B, H, S, d) reshapes.
- LayerNorm normalises over channels (dim 1) and can divide by a pre-normalizer first: a power
  of two from max |x - mean| (exact to apply, computed with frexp), which keeps the sum of
  squares finite in float16 (docs/prenormalizer.md). The softmax subtracts the row maximum
  (the scaled softmax), so exp never overflows.
- The depthwise convolution is a (1, K) Conv2d over the same layout, with its causal left
  context passed in as a cache, exactly as in the streaming model.
- The caches stay in that layout between chunks: a layer's keys and values are the K and V
  projections of past frames as they came out of the 1x1 convolution, (B, C, 1, S_cached),
  so a chunk appends its own along S and each head takes its channel slice; nothing is
  transposed or reshaped to store or read them.
- Large intermediate tensors are split so that each piece stays in cache: the feed-forward's
  4x-wide hidden activation is computed in channel slices of at most `ff_slice` channels, each
  slice's up-projection, SiLU and share of the down-projection done before the next (the sum
  of the slices' down-projections is the down-projection of the whole).

`AcceleratorConformer.forward_chunk` has the same inputs and outputs as
`ConformerCTC.forward_chunk` (its caches in its own layout, from its own `empty_cache`), so the
transformed model drops into the streaming recognizer and is tested to give the same
log-probabilities.
"""

from __future__ import annotations

import copy
import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.asr.conformer import (
    ConformerBlock,
    ConformerCTC,
    ConvModule,
    FeedForward,
    LayerCache,
    SelfAttention,
    rope_tables,
)


def conv1x1(linear: nn.Linear) -> nn.Conv2d:
    """The 1x1 Conv2d computing `linear` over (B, C, 1, S)."""
    conv = nn.Conv2d(linear.in_features, linear.out_features, 1, bias=linear.bias is not None)
    with torch.no_grad():
        conv.weight.copy_(linear.weight[:, :, None, None])
        if linear.bias is not None:
            conv.bias.copy_(linear.bias)
    return conv


class ChannelLayerNorm(nn.Module):
    """LayerNorm over dim 1 of (B, C, 1, S), optionally pre-normalized by a power of two.

    The pre-normalizer s = 2^e with e = exponent of max |x - mean| (so |x - mean| / s < 1):
    dividing by a power of two is exact, and the sum of C squares of values below 1 stays
    below C, finite in float16 for any C < 65504. eps is scaled by 1/s^2 to match."""

    def __init__(self, norm: nn.LayerNorm, prenormalize: bool) -> None:
        super().__init__()
        channels = norm.normalized_shape[0]
        self.weight = nn.Parameter(norm.weight.detach().clone().view(1, channels, 1, 1))
        self.bias = nn.Parameter(norm.bias.detach().clone().view(1, channels, 1, 1))
        self.eps = norm.eps
        self.prenormalize = prenormalize

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=1, keepdim=True)
        eps = torch.tensor(self.eps)
        if self.prenormalize:
            # frexp: top = m * 2^e with 0.5 <= m < 1, so top / 2^e < 1. Flooring top at
            # sqrt(eps) keeps eps / s^2 <= 4: the scaled epsilon cannot overflow either.
            top = centred.abs().amax(dim=1, keepdim=True).float().clamp(min=math.sqrt(self.eps))
            exponent = torch.frexp(top).exponent
            centred = torch.ldexp(centred, -exponent.to(centred.dtype))
            eps = torch.ldexp(torch.full_like(top, self.eps), -2 * exponent)  # eps / s^2
        variance = centred.pow(2).mean(dim=1, keepdim=True)
        return centred * torch.rsqrt(variance + eps.to(x.dtype)) * self.weight + self.bias


class AcceleratorFeedForward(nn.Module):
    """down(silu(up(norm(x)))) with the hidden channels in slices of at most `ff_slice`."""

    def __init__(self, ff: FeedForward, prenormalize: bool, ff_slice: int) -> None:
        super().__init__()
        self.norm = ChannelLayerNorm(ff.norm, prenormalize)
        hidden = ff.up.out_features
        slices = list(itertools.pairwise([*range(0, hidden, ff_slice), hidden]))
        self.ups = nn.ModuleList(_conv1x1_rows(ff.up, lo, hi) for lo, hi in slices)
        self.downs = nn.ModuleList(
            _conv1x1_columns(ff.down, lo, hi, first=lo == 0) for lo, hi in slices
        )

    def forward(self, x: Tensor) -> Tensor:
        normed = self.norm(x)
        out = None
        for up, down in zip(self.ups, self.downs, strict=True):
            piece = down(F.silu(up(normed)))
            out = piece if out is None else out + piece
        return out


def _conv1x1_rows(linear: nn.Linear, lo: int, hi: int) -> nn.Conv2d:
    """The 1x1 Conv2d computing output channels lo..hi of `linear`."""
    part = nn.Linear(linear.in_features, hi - lo, bias=linear.bias is not None)
    with torch.no_grad():
        part.weight.copy_(linear.weight[lo:hi])
        if linear.bias is not None:
            part.bias.copy_(linear.bias[lo:hi])
    return conv1x1(part)


def _conv1x1_columns(linear: nn.Linear, lo: int, hi: int, first: bool) -> nn.Conv2d:
    """The 1x1 Conv2d applying `linear` to input channels lo..hi only (the bias once)."""
    part = nn.Linear(hi - lo, linear.out_features, bias=first and linear.bias is not None)
    with torch.no_grad():
        part.weight.copy_(linear.weight[:, lo:hi])
        if part.bias is not None:
            part.bias.copy_(linear.bias)
    return conv1x1(part)


class AcceleratorAttention(nn.Module):
    """Per-head attention with einsum over (B, C, 1, S); RoPE applied per head's halves."""

    def __init__(self, attention: SelfAttention, prenormalize: bool) -> None:
        super().__init__()
        self.num_heads, self.head_dim = attention.num_heads, attention.head_dim
        self.norm = ChannelLayerNorm(attention.norm, prenormalize)
        self.qkv, self.out = conv1x1(attention.qkv), conv1x1(attention.out)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, C, 1, S); rope: cos, sin (1, hd/2, 1, S); cache: the rotated keys and the
        values of past frames, (B, C, 1, S_cached) each. Returns the output and the cache
        with this chunk's keys and values appended (the caller trims it)."""
        d = self.num_heads * self.head_dim
        q, k, v = self.qkv(self.norm(x)).split(d, dim=1)
        keys = torch.cat([cache[0], _rotate_heads(k, rope, self.head_dim)], dim=3)
        values = torch.cat([cache[1], v], dim=3)
        scale = 1.0 / math.sqrt(self.head_dim)
        outputs = []
        for qh, kh, vh in zip(
            q.split(self.head_dim, dim=1),
            keys.split(self.head_dim, dim=1),
            values.split(self.head_dim, dim=1),
            strict=True,
        ):
            qh = _rotate(qh, *rope)
            # The one transpose: K to (B, S_k, 1, hd). Scores (B, S_k, 1, S_q), softmax over keys.
            scores = torch.einsum("bchq,bkhc->bkhq", qh, kh.transpose(1, 3)) * scale
            weights = torch.softmax(scores, dim=1)  # subtracts the max: no exp overflow
            outputs.append(torch.einsum("bkhq,bchk->bchq", weights, vh))
        return self.out(torch.cat(outputs, dim=1)), keys, values


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=1)


def _rotate_heads(x: Tensor, rope: tuple[Tensor, Tensor], head_dim: int) -> Tensor:
    """RoPE on every head's channel slice of x (B, H * hd, 1, S), heads kept together."""
    return torch.cat([_rotate(h, *rope) for h in x.split(head_dim, dim=1)], dim=1)


class AcceleratorConv(nn.Module):
    def __init__(self, conv: ConvModule, prenormalize: bool) -> None:
        super().__init__()
        d = conv.depthwise.in_channels
        self.context = conv.context
        self.norm = ChannelLayerNorm(conv.norm, prenormalize)
        self.pointwise_in = conv1x1(conv.pointwise_in)
        kernel = conv.depthwise.kernel_size[0]
        self.depthwise = nn.Conv2d(d, d, (1, kernel), groups=d)
        with torch.no_grad():
            self.depthwise.weight.copy_(conv.depthwise.weight[:, :, None, :])
            self.depthwise.bias.copy_(conv.depthwise.bias)
        self.depthwise_norm = ChannelLayerNorm(conv.depthwise_norm, prenormalize)
        self.pointwise_out = conv1x1(conv.pointwise_out)

    def forward(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, C, 1, S); cache: the last kernel - 1 inputs, (B, C, 1, kernel - 1)."""
        y = F.glu(self.pointwise_in(self.norm(x)), dim=1)
        y = torch.cat([cache, y], dim=3)
        new_cache = y[:, :, :, y.shape[3] - self.context :]
        y = self.pointwise_out(F.silu(self.depthwise_norm(self.depthwise(y))))
        return y, new_cache


class AcceleratorBlock(nn.Module):
    def __init__(self, block: ConformerBlock, prenormalize: bool, ff_slice: int) -> None:
        super().__init__()
        self.ff_first = AcceleratorFeedForward(block.ff_first, prenormalize, ff_slice)
        self.attention = AcceleratorAttention(block.attention, prenormalize)
        self.conv = AcceleratorConv(block.conv, prenormalize)
        self.ff_last = AcceleratorFeedForward(block.ff_last, prenormalize, ff_slice)
        self.norm = ChannelLayerNorm(block.norm, prenormalize)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: LayerCache
    ) -> tuple[Tensor, LayerCache]:
        x = x + 0.5 * self.ff_first(x)
        attended, keys, values = self.attention(x, rope, (cache.keys, cache.values))
        x = x + attended
        convolved, conv_cache = self.conv(x, cache.conv)
        x = x + convolved
        return self.norm(x + 0.5 * self.ff_last(x)), LayerCache(keys, values, conv_cache)


class AcceleratorConformer(nn.Module):
    """`ConformerCTC` in the accelerator layout; the same streaming interface.

    ff_slice: the most hidden channels of a feed-forward computed at once (default 256: the
    bundled model's 576 go in slices of 256, 256 and 64)."""

    def __init__(self, model: ConformerCTC, prenormalize: bool = True, ff_slice: int = 256) -> None:
        super().__init__()
        if ff_slice < 1:
            raise ValueError(f"expected ff_slice >= 1, got {ff_slice}")
        self.config = model.config
        self.subsampling = copy.deepcopy(model.subsampling)  # already convolutions
        self.blocks = nn.ModuleList(
            AcceleratorBlock(b, prenormalize, ff_slice) for b in model.blocks
        )
        self.head = conv1x1(model.head)
        self.eval()

    def empty_cache(self, batch: int = 1) -> list[LayerCache]:
        """Per layer: keys and values (B, C, 1, 0), conv inputs (B, C, 1, kernel - 1)."""
        c = self.config
        weight = self.head.weight
        empty = weight.new_zeros(batch, c.d_model, 1, 0)
        conv = weight.new_zeros(batch, c.d_model, 1, c.conv_kernel - 1)
        return [LayerCache(empty, empty, conv) for _ in range(c.num_layers)]

    def forward_chunk(
        self, x: Tensor, offset: int, caches: list[LayerCache], max_cached: int
    ) -> tuple[Tensor, list[LayerCache]]:
        """x: subsampled frames (1, T, D) as the streaming model takes them."""
        c = self.config
        positions = torch.arange(offset, offset + x.shape[1])
        cos, sin = rope_tables(c.d_model // c.num_heads, positions, c.rope_base)
        rope = (cos.T[None, :, None].to(x.dtype), sin.T[None, :, None].to(x.dtype))
        h = x.transpose(1, 2)[:, :, None]  # (B, D, 1, T): the one layout change, at the input
        updated = []
        for block, cache in zip(self.blocks, caches, strict=True):
            h, new = block(h, rope, cache)
            if max_cached >= 0:
                keep = max(0, new.keys.shape[3] - max_cached)
                new = LayerCache(new.keys[..., keep:], new.values[..., keep:], new.conv)
            updated.append(new)
        logits = self.head(h)[:, :, 0].transpose(1, 2)  # (B, T, vocab)
        return F.log_softmax(logits.float(), dim=-1), updated
