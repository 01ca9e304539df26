"""Streaming Conformer-CTC: the encoder, its chunk masks and the per-chunk cached step.

One readable file, as in nanoGPT: subsampling, the Conformer block (macaron feed-forwards,
chunk-masked self-attention, causal convolution module) and the CTC head.

Streaming design (as WeNet's U2): attention sees its own chunk and `left_chunks` chunks before
it, so a chunk's output never changes once computed; the depthwise convolution is causal; the
subsampling convolutions are unpadded in time, so subsampled frame i depends on fbank frames
4i..4i+6 only. `forward_chunk` runs one chunk with caches (the last keys and values per layer,
the last `conv_kernel - 1` convolution inputs) and equals the offline chunk-masked `forward`.

Positions: rotary embeddings (RoPE) on queries and keys, at absolute subsampled-frame indices.
Why: cached keys stay valid as they are (rotated once, when written), so a chunk step needs no
relative-position matrix; the scores depend only on position differences, as with the relative
encodings Conformer used first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.asr.frames import SUBSAMPLING_CONTEXT, SUBSAMPLING_FACTOR, encoder_frames

SUBSAMPLING_KINDS = ("dwsep", "conv2d")


@dataclass(frozen=True)
class ConformerConfig:
    """Shape of the encoder. `vocab_size` counts the CTC blank (id 0)."""

    vocab_size: int = 29
    num_mel_bins: int = 80
    d_model: int = 144
    num_heads: int = 4
    num_layers: int = 8
    ff_mult: int = 4
    conv_kernel: int = 15
    subsampling: str = "dwsep"  # depthwise separable (the paper) or vanilla Conv2d
    subsampling_channels: int = 144
    dropout: float = 0.1
    rope_base: float = 10_000.0

    def __post_init__(self) -> None:
        if self.subsampling not in SUBSAMPLING_KINDS:
            raise ValueError(
                f"expected subsampling in {SUBSAMPLING_KINDS}, got {self.subsampling!r}"
            )
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"expected d_model ({self.d_model}) divisible by num_heads ({self.num_heads}) "
                "into an even head size"
            )
        if self.conv_kernel < 1 or self.vocab_size < 2:
            raise ValueError("expected conv_kernel >= 1 and vocab_size >= 2")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def subsampled_length(frames: int | Tensor) -> int | Tensor:
    """Encoder frames from `frames` fbank frames (unpadded kernel-3 stride-2 convs, twice).

    >>> [subsampled_length(n) for n in (0, 6, 7, 10, 11, 100)]
    [0, 0, 1, 1, 2, 24]
    """
    if isinstance(frames, Tensor):
        return torch.clamp((frames - SUBSAMPLING_CONTEXT) // SUBSAMPLING_FACTOR + 1, min=0)
    return encoder_frames(frames)


class Subsampling(nn.Module):
    """(B, T, 80) fbank -> (B, T', d_model), T' = subsampled_length(T).

    `dwsep`: a 3x3 stride-2 conv from 1 channel (cheap: one input channel), then a depthwise
    3x3 stride-2 conv and a pointwise 1x1 conv. `conv2d`: two dense 3x3 stride-2 convs, where
    the second one's C*C*9 multiply-adds per output dominate the whole front end.
    """

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        c = config.subsampling_channels
        if config.subsampling == "dwsep":
            second: list[nn.Module] = [
                nn.Conv2d(c, c, 3, stride=2, groups=c),
                nn.Conv2d(c, c, 1),
            ]
        else:
            second = [nn.Conv2d(c, c, 3, stride=2)]
        self.convs = nn.Sequential(nn.Conv2d(1, c, 3, stride=2), nn.ReLU(), *second, nn.ReLU())
        freq = ((config.num_mel_bins - 3) // 2 + 1 - 3) // 2 + 1
        self.project = nn.Linear(c * freq, config.d_model)

    def forward(self, features: Tensor) -> Tensor:
        x = self.convs(features.unsqueeze(1))  # (B, C, T', F')
        return self.project(x.permute(0, 2, 1, 3).flatten(2))


def rope_tables(head_dim: int, positions: Tensor, base: float) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (len(positions), head_dim / 2) for absolute `positions`."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = base ** (-steps / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (first half, second half) of the last dim of x: (B, H, T, D)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def chunk_mask(
    frames: int, chunk: int, left_chunks: int, device: torch.device | None = None
) -> Tensor:
    """Boolean (frames, frames), True where query i may attend to key j.

    chunk <= 0: full context. Otherwise i sees its own chunk and `left_chunks` chunks before it
    (left_chunks < 0: all of them).

    >>> chunk_mask(4, 2, 0).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    """
    if chunk <= 0:
        return torch.ones(frames, frames, dtype=torch.bool, device=device)
    index = torch.arange(frames, device=device) // chunk
    visible = index[None, :] <= index[:, None]
    if left_chunks >= 0:
        visible &= index[None, :] >= index[:, None] - left_chunks
    return visible


class FeedForward(nn.Module):
    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        hidden = config.d_model * config.ff_mult
        self.norm = nn.LayerNorm(config.d_model)
        self.up = nn.Linear(config.d_model, hidden)
        self.down = nn.Linear(hidden, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(self.dropout(F.silu(self.up(self.norm(x))))))


class SelfAttention(nn.Module):
    """Multi-head self-attention with RoPE; keys/values of earlier chunks come from a cache."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.norm = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.attention_dropout = config.dropout

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, cache: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, D); mask: bool (B or 1, 1, T, cached + T); cache: keys, values
        (B, H, cached, hd). Returns the output and the keys, values of cache + x."""
        b, t, _ = x.shape
        q, k, v = (
            self.qkv(self.norm(x))
            .view(b, t, 3, self.num_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
        )
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        keys, values = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        attended = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
        )
        y = self.out(attended.transpose(1, 2).reshape(b, t, -1))
        return self.dropout(y), keys, values


class ConvModule(nn.Module):
    """Pointwise conv + GLU, causal depthwise conv, LayerNorm, SiLU, pointwise conv.

    LayerNorm rather than the original BatchNorm: it has no running statistics to drift
    between training batches and single-stream chunks, and it is what the pre-normalizer
    makes float16-safe."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.context = config.conv_kernel - 1
        self.norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Linear(d, 2 * d)
        self.depthwise = nn.Conv1d(d, d, config.conv_kernel, groups=d)
        self.depthwise_norm = nn.LayerNorm(d)
        self.pointwise_out = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, T, D); cache: (B, D, kernel - 1), the previous depthwise inputs (zeros at
        the start). Returns the output and the new cache."""
        y = F.glu(self.pointwise_in(self.norm(x)), dim=-1).transpose(1, 2)  # (B, D, T)
        y = torch.cat([cache, y], dim=2)
        new_cache = y[:, :, y.shape[2] - self.context :]
        y = self.depthwise(y).transpose(1, 2)
        y = self.pointwise_out(F.silu(self.depthwise_norm(y)))
        return self.dropout(y), new_cache


class ConformerBlock(nn.Module):
    """x + FF/2, + attention, + convolution, + FF/2, then LayerNorm (Gulati et al., 2020)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.ff_first = FeedForward(config)
        self.attention = SelfAttention(config)
        self.conv = ConvModule(config)
        self.ff_last = FeedForward(config)
        self.norm = nn.LayerNorm(config.d_model)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, cache: LayerCache
    ) -> tuple[Tensor, LayerCache]:
        x = x + 0.5 * self.ff_first(x)
        attended, keys, values = self.attention(x, rope, mask, (cache.keys, cache.values))
        x = x + attended
        convolved, conv_cache = self.conv(x, cache.conv)
        x = x + convolved
        x = self.norm(x + 0.5 * self.ff_last(x))
        return x, LayerCache(keys, values, conv_cache)


@dataclass(frozen=True)
class LayerCache:
    """One layer's streaming state: keys, values (B, H, cached, hd), conv (B, D, kernel-1)."""

    keys: Tensor
    values: Tensor
    conv: Tensor


class ConformerCTC(nn.Module):
    """Subsampling, Conformer blocks and a linear CTC head over `vocab_size` (blank = 0)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.subsampling = Subsampling(config)
        self.blocks = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_layers))
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def empty_cache(self, batch: int = 1) -> list[LayerCache]:
        c = self.config
        head_dim = c.d_model // c.num_heads
        weight = self.head.weight
        empty = weight.new_zeros(batch, c.num_heads, 0, head_dim)
        conv = weight.new_zeros(batch, c.d_model, c.conv_kernel - 1)
        return [LayerCache(empty, empty, conv) for _ in range(c.num_layers)]

    def _rope(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        positions = torch.arange(start, start + length, device=self.head.weight.device)
        c = self.config
        return rope_tables(c.d_model // c.num_heads, positions, c.rope_base)

    def forward(
        self, features: Tensor, lengths: Tensor, chunk: int = 0, left_chunks: int = -1
    ) -> tuple[Tensor, Tensor]:
        """Offline, chunk-masked: features (B, T, 80), lengths (B,) -> CTC log-probs
        (B, T', vocab) and output lengths (B,)."""
        x = self.subsampling(features)
        out_lengths = subsampled_length(lengths)
        frames = x.shape[1]
        valid = torch.arange(frames, device=x.device)[None, :] < out_lengths[:, None]
        mask = chunk_mask(frames, chunk, left_chunks, x.device)[None] & valid[:, None, :]
        mask = mask.unsqueeze(1)  # (B, 1, T', T')
        rope = self._rope(0, frames)
        for block, cache in zip(self.blocks, self.empty_cache(x.shape[0]), strict=True):
            x, _ = block(x, rope, mask, cache)
        return F.log_softmax(self.head(x), dim=-1), out_lengths

    def forward_chunk(
        self, x: Tensor, offset: int, caches: list[LayerCache], max_cached: int
    ) -> tuple[Tensor, list[LayerCache]]:
        """One streaming chunk: subsampled frames x (1, T, D) at absolute frame `offset` ->
        log-probs (1, T, vocab) and caches trimmed to the last `max_cached` frames
        (max_cached < 0: unlimited)."""
        t = x.shape[1]
        cached = caches[0].keys.shape[2]
        mask = torch.ones(1, 1, t, cached + t, dtype=torch.bool, device=x.device)
        rope = self._rope(offset, t)
        updated = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, new = block(x, rope, mask, cache)
            if max_cached >= 0:
                keep = max(0, new.keys.shape[2] - max_cached)
                new = LayerCache(new.keys[:, :, keep:], new.values[:, :, keep:], new.conv)
            updated.append(new)
        return F.log_softmax(self.head(x), dim=-1), updated

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
