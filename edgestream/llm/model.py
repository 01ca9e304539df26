"""A Llama-family decoder in one file: our own hot path, no transformers code at run time.

In the spirit of gpt-fast: one config dataclass, one small class per concept, and a key/value
cache allocated once at full size and written at explicit slots. Two things go beyond a plain
autoregressive decoder, because speculative decoding needs them:

* positions (for RoPE) and cache slots are separate. A flattened draft tree is written to
  consecutive cache slots while its tokens carry the positions of their depth in the tree;
* the attention mask is an explicit argument (boolean, True = may attend) over every cache slot
  up to the end of the new tokens, so one call can verify a whole tree.

After verification, `KVCache.compact` moves the accepted path's slots down to be contiguous and
`KVCache.rollback` forgets the rest.

Weights are copied from a `transformers` `LlamaForCausalLM` by `Transformer.from_hf`; q/k/v and
gate/up projections are fused into single matrices so a decode step runs fewer, larger matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int  # rows of the embedding and of the LM head
    dim: int  # width of the residual stream
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads; n_heads % n_kv_heads == 0 (grouped-query attention)
    head_dim: int
    intermediate_size: int  # hidden width of the SwiGLU MLP
    norm_eps: float
    rope_theta: float
    max_position: int  # longest sequence the model was trained for (its context)
    tie_embeddings: bool

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    @classmethod
    def from_hf(cls, hf_config: object) -> ModelConfig:
        """Read a transformers `LlamaConfig`; refuse what this engine does not implement."""
        model_type = getattr(hf_config, "model_type", None)
        if model_type != "llama":
            raise ValueError(
                f"expected a Llama-family model (model_type 'llama'), got {model_type!r}"
            )
        rope = getattr(hf_config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"unsupported RoPE type {rope_type!r}: only 'default' is implemented")
        for flag in ("attention_bias", "mlp_bias"):
            if getattr(hf_config, flag, False):
                raise ValueError(f"unsupported Llama variant: {flag}=True")
        n_heads = hf_config.num_attention_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            dim=hf_config.hidden_size,
            n_layers=hf_config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=hf_config.num_key_value_heads or n_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads,
            intermediate_size=hf_config.intermediate_size,
            norm_eps=hf_config.rms_norm_eps,
            rope_theta=rope.get("rope_theta", 10000.0),
            max_position=hf_config.max_position_embeddings,
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        )


class KVCache:
    """Preallocated keys and values for every layer, indexed by slot.

    `k[layer]` and `v[layer]` have shape (B, n_kv_heads, capacity, head_dim). Slots
    [0, length) hold valid entries; a forward pass appends its tokens at [length, length + T).
    `length` is a host-side int, so reading it never syncs with the device.
    """

    def __init__(
        self,
        config: ModelConfig,
        capacity: int,
        batch_size: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (batch_size, config.n_kv_heads, capacity, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.capacity = capacity
        self.length = 0

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, n_kv_heads, T, head_dim) at [length, length + T) of one layer.

        Returns views of that layer's keys and values over slots [0, length + T).
        """
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def rollback(self, length: int) -> None:
        """Forget every slot from `length` on (the data stays, to be overwritten)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback length must be in [0, {self.length}], got {length}")
        self.length = length

    def compact(self, slots: Tensor, start: int) -> None:
        """Keep only `slots` (1-D, increasing, all >= start) after `start`, moved to be contiguous.

        Used after tree verification: the accepted path's entries, scattered over the flattened
        tree, become slots [start, start + len(slots)) and everything after them is forgotten.
        """
        n = slots.numel()
        if n and (int(slots.min()) < start or int(slots.max()) >= self.length):  # host sync
            raise ValueError(f"slots must lie in [{start}, {self.length}), got {slots.tolist()}")
        for cache in (*self.k, *self.v):
            # index_select copies first, so overlapping source and destination ranges are safe.
            cache[:, :, start : start + n] = cache.index_select(2, slots)
        self.length = start + n


class PackedLinear(nn.Module):
    """Inference-only y = x W^T with W prepacked into oneDNN's blocked layout.

    Why: a decode step is bound by streaming the weights from memory. On this class of CPU,
    MKL's matrix-vector product reads float32 weights at ~17 GB/s while oneDNN's prepacked
    kernel reaches ~50 GB/s, which makes a whole float32 decode step ~1.7x faster. The packed
    tensor is opaque and has no backward: training uses the plain `nn.Linear` model.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear supports bias-free layers only")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = linear.weight.dtype
        # No batch-size hint: a layout tuned for one row (hint 1) made 4- and 16-row products
        # (draft verification) 2-4x slower in float32 here, for no gain at one row.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, None, "none", [], "")

    def plain_weight(self) -> Tensor:
        """The (out, in) weight back from the opaque packed layout: the layer applied to the
        identity, exact (each output is one product by 1 plus exact zeros)."""
        return self(torch.eye(self.in_features, dtype=self.dtype)).T.contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def can_pack_weights() -> bool:
    """Whether this PyTorch build has the oneDNN ops `PackedLinear` needs."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def native_bfloat16() -> bool:
    """Whether oneDNN computes bfloat16 natively here (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()


def packed_or_plain(linear: nn.Linear) -> nn.Module:
    """`PackedLinear(linear)` where oneDNN can pack its dtype here, else `linear` unchanged.

    Why: oneDNN packs bfloat16 weights only where bfloat16 is native; on an AVX2-only CPU the
    reorder raises, so those layers stay plain `nn.Linear`.
    """
    if not can_pack_weights() or (linear.weight.dtype == torch.bfloat16 and not native_bfloat16()):
        return linear
    return PackedLinear(linear)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Upcast: a sum of squares in bfloat16 loses the small components.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Cos/sin tables for every position, computed once in float32 and gathered per call."""

    def __init__(self, head_dim: int, max_position: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        freqs = torch.arange(max_position, dtype=torch.float)[:, None] * inv_freq  # (P, hd/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (P, hd): the half-rotation layout
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions (B, T) -> cos, sin each (B, 1, T, head_dim), broadcast over heads."""
        return self.cos[positions].to(dtype)[:, None], self.sin[positions].to(dtype)[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, T, hd) by RoPE, pairing dimension i with i + hd/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        qkv_out = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim
        self.wqkv = nn.Linear(config.dim, qkv_out, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None,
        cache: KVCache,
        layer: int,
    ) -> Tensor:
        """x (B, T, dim); mask (B, 1, T, S) bool or None for "all S slots"; returns (B, T, dim)."""
        B, T, _ = x.shape
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.write(layer, k, v)  # (B, Hkv, S, hd), S = cache.length + T
        out = grouped_query_attention(q, keys, values, mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, q_size))  # (B, T, H * hd)


def grouped_query_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """q (B, H, T, hd) over keys/values (B, Hkv, S, hd); mask (B, 1, T, S) bool or None.

    Below float32 the query heads that share a key/value head are folded into rows of that
    head. Why: PyTorch's CPU attention kernel starves on one query row per head in bfloat16:
    131 us per layer for one new token (2 threads, 300 cached slots, SmolLM2's 9 query and
    3 key/value heads) against 28 us folded, which makes a bfloat16 decode step ~15% faster;
    4-16 rows gain 4-20%. In float32 the plain kernel is as fast or faster (18 vs 25 us at one
    row), so float32 keeps it.
    """
    B, H, T, hd = q.shape
    group = H // keys.shape[1]
    if q.dtype == torch.float32 or group == 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=group > 1)
    rows = q.reshape(B, -1, group * T, hd)  # row r * T + t: query head kv * group + r, token t
    mask = None if mask is None else mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask)
    return out.reshape(B, H, T, hd)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(config.dim, 2 * config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(self.w_gate_up, self.w_down, x)


def swiglu(w_gate_up: nn.Module, w_down: nn.Module, x: Tensor) -> Tensor:
    """down(silu(gate(x)) * up(x)), gate and up fused in w_gate_up (also used for stream rows
    through other copies of the weights)."""
    gate, up = w_gate_up(x).chunk(2, dim=-1)
    return w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None,
        cache: KVCache,
        layer: int,
    ) -> Tensor:
        x = x + self.attention(self.attention_norm(x), rope, mask, cache, layer)
        return x + self.feed_forward(self.ffn_norm(x))


def causal_mask(query_slots: Tensor, n_slots: int) -> Tensor:
    """Boolean mask (T, n_slots), True where the key slot is at or before the query's slot.

    >>> causal_mask(torch.tensor([1, 2]), 3).int()
    tensor([[1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return torch.arange(n_slots)[None, :] <= query_slots[:, None]


class Transformer(nn.Module):
    """The decoder. Call `forward` with explicit positions, an optional mask and a KVCache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.rope = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    def new_cache(self, capacity: int, batch_size: int = 1) -> KVCache:
        if not capacity > 0:
            raise ValueError(f"cache capacity must be positive, got {capacity}")
        return KVCache(self.config, capacity, batch_size, self.dtype)

    def prepare(
        self,
        tokens: Tensor,
        cache: KVCache,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Embeddings (B, T, dim), RoPE tables and 4-D mask for new tokens; see hidden_states."""
        B, T = tokens.shape
        start = cache.length
        if start + T > cache.capacity:
            raise ValueError(f"{start + T} tokens exceed the cache capacity {cache.capacity}")
        if positions is None:
            positions = torch.arange(start, start + T)
        if mask is None and T > 1:
            mask = causal_mask(torch.arange(start, start + T), start + T)
        if mask is not None and mask.dim() == 2:
            mask = mask[None, None]  # (1, 1, T, S)
        rope = self.rope(positions.expand(B, T), self.dtype)
        return self.tok_embeddings(tokens), rope, mask

    def hidden_states(
        self,
        tokens: Tensor,
        cache: KVCache,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Run the decoder on new tokens and append their keys/values to the cache.

        tokens: (B, T) ids. positions: (B, T) or (T,) RoPE positions; by default the tokens
        continue the sequence, at cache.length + arange(T). mask: (T, S) or (B, 1, T, S) bool
        over the S = cache.length + T slots, True = may attend; by default causal by slot.
        Returns the final-norm hidden states (B, T, dim).
        """
        x, rope, mask = self.prepare(tokens, cache, positions, mask)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, cache, i)
        cache.length += tokens.shape[1]
        return self.norm(x)

    def forward(
        self,
        tokens: Tensor,
        cache: KVCache,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Logits (B, T, vocab) in float32; with `last_only`, (B, 1, vocab) for the last token.

        See `hidden_states` for the arguments. Computing the LM head for the last token only
        saves a (T x dim x vocab) matmul during prefill.
        """
        h = self.hidden_states(tokens, cache, positions, mask)
        if last_only:
            h = h[:, -1:]
        return self.output(h).float()

    def lm_head_weight(self) -> Tensor:
        """The plain (vocab, dim) LM head weight, for heads over part of the vocabulary."""
        if self.config.tie_embeddings:
            return self.tok_embeddings.weight
        if isinstance(self.output, nn.Linear):
            return self.output.weight
        raise ValueError("an untied LM head has no plain weight once packed: load with pack=False")

    def pack_weights(self) -> Transformer:
        """Replace every linear layer by a `PackedLinear`, in place; inference only afterwards.

        Do it after any dtype change. The tied embedding table keeps its plain copy.
        """
        for module in list(self.modules()):
            for name, child in module.named_children():
                if isinstance(child, nn.Linear):
                    setattr(module, name, packed_or_plain(child))
        return self

    @classmethod
    def from_hf(cls, hf_model: nn.Module, dtype: torch.dtype = torch.float32) -> Transformer:
        """Build from a transformers `LlamaForCausalLM`, fusing q/k/v and gate/up weights."""
        config = ModelConfig.from_hf(hf_model.config)
        sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(_hf_state_to_ours(sd, config), assign=True)
        if config.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        # RoPE tables were built on the meta device; rebuild them for real.
        model.rope = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta)
        return model.to(dtype).eval().requires_grad_(False)


def _hf_state_to_ours(sd: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Rename a transformers Llama state dict to this module's names, fusing projections."""
    embed = sd["model.embed_tokens.weight"]
    out = {
        "tok_embeddings.weight": embed,
        "norm.weight": sd["model.norm.weight"],
        "output.weight": embed if config.tie_embeddings else sd["lm_head.weight"],
    }
    for i in range(config.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        out[ours + "attention.wqkv.weight"] = torch.cat(
            [sd[attn + "q_proj.weight"], sd[attn + "k_proj.weight"], sd[attn + "v_proj.weight"]]
        )
        out[ours + "attention.wo.weight"] = sd[attn + "o_proj.weight"]
        out[ours + "feed_forward.w_gate_up.weight"] = torch.cat(
            [sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]]
        )
        out[ours + "feed_forward.w_down.weight"] = sd[mlp + "down_proj.weight"]
        out[ours + "attention_norm.weight"] = sd[hf + "input_layernorm.weight"]
        out[ours + "ffn_norm.weight"] = sd[hf + "post_attention_layernorm.weight"]
    return out
