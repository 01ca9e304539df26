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

`AcceleratorConformer.forward_chunk` has the same inputs and outputs as
`ConformerCTC.forward_chunk` (caches in the original layout), so the transformed model drops
into the streaming recognizer and is tested to give the same log-probabilities.
"""

from __future__ import annotations

import copy
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
    def __init__(self, ff: FeedForward, prenormalize: bool) -> None:
        super().__init__()
        self.norm = ChannelLayerNorm(ff.norm, prenormalize)
        self.up, self.down = conv1x1(ff.up), conv1x1(ff.down)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.up(self.norm(x))))


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
        """x: (B, C, 1, S); rope: cos, sin (1, hd/2, 1, S); cache: keys, values in the
        streaming model's (B, H, cached, hd) layout. Returns output and the updated cache."""
        d = self.num_heads * self.head_dim
        q, k, v = self.qkv(self.norm(x)).split(d, dim=1)
        heads_q = [_rotate(h, *rope) for h in q.split(self.head_dim, dim=1)]
        heads_k = [_rotate(h, *rope) for h in k.split(self.head_dim, dim=1)]
        heads_v = v.split(self.head_dim, dim=1)
        scale = 1.0 / math.sqrt(self.head_dim)
        outputs, new_keys, new_values = [], [], []
        for h, (qh, kh, vh) in enumerate(zip(heads_q, heads_k, heads_v, strict=True)):
            # The cache is (B, H, cached, hd): its head h, as (B, hd, 1, cached), joins the chunk.
            cached_k = cache[0][:, h].transpose(1, 2)[:, :, None]
            cached_v = cache[1][:, h].transpose(1, 2)[:, :, None]
            keys, values = torch.cat([cached_k, kh], dim=3), torch.cat([cached_v, vh], dim=3)
            new_keys.append(keys)
            new_values.append(values)
            # The one transpose: K to (B, S_k, 1, hd). Scores (B, S_k, 1, S_q), softmax over keys.
            scores = torch.einsum("bchq,bkhc->bkhq", qh, keys.transpose(1, 3)) * scale
            weights = torch.softmax(scores, dim=1)  # subtracts the max: no exp overflow
            outputs.append(torch.einsum("bkhq,bchk->bchq", weights, values))
        y = self.out(torch.cat(outputs, dim=1))
        keys = torch.stack([k_[:, :, 0].transpose(1, 2) for k_ in new_keys], dim=1)
        values = torch.stack([v_[:, :, 0].transpose(1, 2) for v_ in new_values], dim=1)
        return y, keys, values


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=1)


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
        """x: (B, C, 1, S); cache: (B, C, kernel - 1) as in the streaming model."""
        y = F.glu(self.pointwise_in(self.norm(x)), dim=1)
        y = torch.cat([cache[:, :, None], y], dim=3)
        new_cache = y[:, :, 0, y.shape[3] - self.context :]
        y = self.pointwise_out(F.silu(self.depthwise_norm(self.depthwise(y))))
        return y, new_cache


class AcceleratorBlock(nn.Module):
    def __init__(self, block: ConformerBlock, prenormalize: bool) -> None:
        super().__init__()
        self.ff_first = AcceleratorFeedForward(block.ff_first, prenormalize)
        self.attention = AcceleratorAttention(block.attention, prenormalize)
        self.conv = AcceleratorConv(block.conv, prenormalize)
        self.ff_last = AcceleratorFeedForward(block.ff_last, prenormalize)
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
    """`ConformerCTC` in the accelerator layout; the same streaming interface."""

    def __init__(self, model: ConformerCTC, prenormalize: bool = True) -> None:
        super().__init__()
        self.config = model.config
        self.subsampling = copy.deepcopy(model.subsampling)  # already convolutions
        self.blocks = nn.ModuleList(AcceleratorBlock(b, prenormalize) for b in model.blocks)
        self.head = conv1x1(model.head)
        self.eval()

    def empty_cache(self, batch: int = 1) -> list[LayerCache]:
        c = self.config
        weight = self.head.weight
        empty = weight.new_zeros(batch, c.num_heads, 0, c.d_model // c.num_heads)
        conv = weight.new_zeros(batch, c.d_model, c.conv_kernel - 1)
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
                keep = max(0, new.keys.shape[2] - max_cached)
                new = LayerCache(new.keys[:, :, keep:], new.values[:, :, keep:], new.conv)
            updated.append(new)
        logits = self.head(h)[:, :, 0].transpose(1, 2)  # (B, T, vocab)
        return F.log_softmax(logits.float(), dim=-1), updated
