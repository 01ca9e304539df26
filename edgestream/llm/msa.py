"""Multi-stream attention (MSA): speculative streams inside the top N_s decoder layers.

At a position t the main stream is the ordinary decoder. Speculative stream j (1..gamma) starts
at the input of layer N - N_s as the main stream's hidden state there plus a learned stream
embedding P_j, and runs through the top N_s layers with the base weights (plus optional low-rank
adapters that touch stream tokens only). Stream j attends to the main stream's keys/values at
positions <= t (from the KV cache) and to streams 1..j at t; it never writes the cache. After
the shared final norm and LM head, stream j predicts token t + 1 + j (the main stream, t + 1).

Lossless by construction: the main stream never attends to streams, so its logits are exactly
the base model's. Each MSA layer runs the main rows through the unchanged `Block` first, then
the stream rows through the same weights while they are still hot in the CPU cache.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.int8 import Int8Linear
from edgestream.llm.model import (
    Block,
    KVCache,
    Transformer,
    apply_rotary,
    grouped_query_attention,
    packed_or_plain,
    swiglu,
)
from edgestream.llm.weights_file import load_drafter, save_weights


@dataclass(frozen=True)
class StreamConfig:
    n_streams: int = 4  # gamma: speculative streams, i.e. draft depth below the root
    n_stream_layers: int = 4  # N_s: top decoder layers with multi-stream attention
    adapter_rank: int = 16  # rank of stream-only adapters on q/k/v and o; 0 = embeddings only
    # Rank of a map from the embedding of the main stream's next token (the draft root) into
    # the streams' input; 0 = off. Needs the root before the streams run: placement "accepted".
    next_token_rank: int = 16
    # Streams draft only among this many of the most frequent answer tokens (0 = the whole
    # vocabulary): a 6x smaller LM head for training and drafting, at the cost of never
    # proposing a rare token (verification stays exact either way).
    draft_vocab_size: int = 8192
    # Rank of stream-only adapters on the feed-forward's gate/up and down projections; 0 = none
    # (the streams then share the base model's feed-forward unchanged).
    ffn_rank: int = 0

    def __post_init__(self) -> None:
        for name, value, low in (
            ("n_streams", self.n_streams, 1),
            ("n_stream_layers", self.n_stream_layers, 1),
            ("adapter_rank", self.adapter_rank, 0),
            ("next_token_rank", self.next_token_rank, 0),
            ("draft_vocab_size", self.draft_vocab_size, 0),
            ("ffn_rank", self.ffn_rank, 0),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.ffn_rank and not self.adapter_rank:
            raise ValueError("ffn_rank needs adapter_rank > 0 (the adapters hold both)")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class LowRank(nn.Module):
    """x -> B(A x): a rank-r update, zero at initialisation so training starts from the base."""

    def __init__(self, dim_in: int, dim_out: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim_in, rank, bias=False)
        self.up = nn.Linear(rank, dim_out, bias=False)
        nn.init.normal_(self.down.weight, std=dim_in**-0.5)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))


class StreamAdapter(nn.Module):
    """Low-rank updates to one MSA layer's q/k/v and output projections, for stream rows, and
    optionally (`ffn_rank`) to its feed-forward's gate/up and down projections."""

    def __init__(self, block: Block, rank: int, ffn_rank: int = 0) -> None:
        super().__init__()
        attn = block.attention
        qkv_out = (attn.n_heads + 2 * attn.n_kv_heads) * attn.head_dim
        dim = block.attention_norm.weight.shape[0]
        self.qkv = LowRank(dim, qkv_out, rank)
        self.o = LowRank(attn.n_heads * attn.head_dim, dim, rank)
        self.gate_up: LowRank | None = None
        self.down: LowRank | None = None
        if ffn_rank:
            self.add_feed_forward(block, ffn_rank)

    def add_feed_forward(self, block: Block, rank: int) -> None:
        """Feed-forward updates, zero at first: the adapter's output does not change."""
        gate_up, down = block.feed_forward.w_gate_up, block.feed_forward.w_down
        self.gate_up = LowRank(gate_up.in_features, gate_up.out_features, rank)
        self.down = LowRank(down.in_features, down.out_features, rank)

    def project_qkv(self, block: Block, h: Tensor) -> Tensor:
        return block.attention.wqkv(h) + _low_rank(self.qkv, h)

    def project_out(self, block: Block, out: Tensor) -> Tensor:
        return block.attention.wo(out) + _low_rank(self.o, out)

    def feed_forward(self, block: Block, x: Tensor) -> Tensor:
        if self.gate_up is None or self.down is None:
            return block.feed_forward(x)
        ff = block.feed_forward
        gate, up = (ff.w_gate_up(x) + _low_rank(self.gate_up, x)).chunk(2, dim=-1)
        h = F.silu(gate) * up
        return ff.w_down(h) + _low_rank(self.down, h)


def _low_rank(update: LowRank, x: Tensor) -> Tensor:
    """update(x) in the update's own dtype (float32 while training), returned in x's."""
    return update(x.to(update.up.weight.dtype)).to(x.dtype)


class MergedStreamLayer(nn.Module):
    """One MSA layer's linears for stream rows, ready for inference: the q/k/v and output
    projections with the adapter folded in (W + B A), all four in the drafting dtype
    (`torch.qint8`: int8 weights, `int8.Int8Linear`, computing in float32).

    Why folded: the stream pass runs a handful of rows, so the adapter's four small matmuls,
    casts and adds per layer cost more than the bytes they add to W. Why another dtype: those
    few rows make the stream pass a read of the top N_s layers' weights, which do not stay in
    the CPU cache between passes (SmolLM2's top 10 layers: 140 MB in float32; their matmuls
    are 60% of a stream pass, measured): bfloat16 copies halve the bytes, int8 ones quarter
    them. Drafts decide only what is verified, never what is accepted, so the output stays the
    base model's at any drafting precision. The residual stream, the norms and attention stay
    in the model's dtype, so stream rows read the main stream's cached keys and values as they
    are.
    """

    def __init__(self, block: Block, adapter: StreamAdapter | None, dtype: torch.dtype) -> None:
        super().__init__()
        attn, ff = block.attention, block.feed_forward
        self.dtype = dtype
        self.compute_dtype = compute_dtype(dtype)
        self.wqkv = _converted(attn.wqkv, dtype, adapter.qkv if adapter else None)
        self.wo = _converted(attn.wo, dtype, adapter.o if adapter else None)
        gate_up = adapter.gate_up if adapter else None
        down = adapter.down if adapter else None
        # In the model's own dtype and with no update, the block's feed-forward serves as it
        # is: no copy.
        own = dtype == block.attention_norm.weight.dtype and gate_up is None and down is None
        self.w_gate_up = None if own else _converted(ff.w_gate_up, dtype, gate_up)
        self.w_down = None if own else _converted(ff.w_down, dtype, down)

    def project_qkv(self, block: Block, h: Tensor) -> Tensor:
        return self.wqkv(h.to(self.compute_dtype)).to(h.dtype)

    def project_out(self, block: Block, out: Tensor) -> Tensor:
        return self.wo(out.to(self.compute_dtype)).to(out.dtype)

    def feed_forward(self, block: Block, x: Tensor) -> Tensor:
        if self.w_gate_up is None or self.w_down is None:
            return block.feed_forward(x)
        return swiglu(self.w_gate_up, self.w_down, x.to(self.compute_dtype)).to(x.dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a drafting layer's inputs and outputs are in: int8 layers compute in float32."""
    return torch.float32 if dtype == torch.qint8 else dtype


def _converted(base: nn.Module, dtype: torch.dtype, update: LowRank | None = None) -> nn.Module:
    """A linear layer computing base(x) (+ update(x)) with weights in `dtype` (int8 for
    `torch.qint8`), packed unless base is a plain (training) layer; base itself when there is
    nothing to change."""
    weight = base.weight if isinstance(base, nn.Linear) else base.plain_weight()
    if update is None and weight.dtype == dtype:
        return base
    merged = weight.float()
    if update is not None:
        merged = merged + update.up.weight.float() @ update.down.weight.float()  # (out, in)
    return _inference_linear(merged, dtype, pack=not isinstance(base, nn.Linear))


def _inference_linear(weight: Tensor, dtype: torch.dtype, pack: bool) -> nn.Module:
    """y = x weight^T with the (out, in) weight held in `dtype`: an `Int8Linear` for
    `torch.qint8`, else a frozen linear layer, packed where oneDNN can (if `pack`)."""
    if dtype == torch.qint8:
        return Int8Linear(weight)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
    linear.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
    return packed_or_plain(linear) if pack else linear


class SpeculativeStreams(nn.Module):
    """The trainable part of Speculative Streaming; the base model stays untouched.

    Holds the stream embeddings P_j (gamma, dim) and the per-layer stream adapters. `split` is
    the index of the first MSA layer, N - N_s.
    """

    def __init__(self, model_config: object, config: StreamConfig) -> None:
        super().__init__()
        n_layers, dim = model_config.n_layers, model_config.dim
        if config.n_stream_layers > n_layers:
            raise ValueError(
                f"n_stream_layers ({config.n_stream_layers}) exceeds the model's {n_layers} layers"
            )
        self.config = config
        self.split = n_layers - config.n_stream_layers
        self.draft_dtype: torch.dtype | None = None  # set by `merged_for`; None: the model's
        self.embeddings = nn.Parameter(torch.randn(config.n_streams, dim) * 0.02)
        self.next_token = (
            LowRank(dim, dim, config.next_token_rank) if config.next_token_rank else None
        )
        if config.draft_vocab_size > model_config.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({config.draft_vocab_size}) exceeds the vocabulary "
                f"({model_config.vocab_size}): use a smaller one, or 0 for all of it "
                "(--draft-vocab)"
            )
        # Token ids of the draft vocabulary, most frequent first; set by training.
        self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        self.adapters = nn.ModuleList()
        if config.adapter_rank:
            template = Block(model_config)
            self.adapters.extend(
                StreamAdapter(template, config.adapter_rank, config.ffn_rank)
                for _ in range(config.n_stream_layers)
            )

    def add_feed_forward_adapters(self, model_config: object, rank: int) -> None:
        """Give streams trained without feed-forward adapters rank-`rank` ones, zero at first,
        so training continues from exactly what they draft."""
        if self.config.ffn_rank:
            raise ValueError(
                f"these streams already have feed-forward adapters (rank {self.config.ffn_rank})"
            )
        if not len(self.adapters):
            raise ValueError("feed-forward adapters need streams with adapters (adapter_rank > 0)")
        template = Block(model_config)
        for adapter in self.adapters:
            adapter.add_feed_forward(template, rank)
        self.config = replace(self.config, ffn_rank=rank)

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def merged_for(
        self, model: Transformer, dtype: torch.dtype | None = None
    ) -> SpeculativeStreams:
        """A copy for inference whose stream rows go through `MergedStreamLayer`s: adapters
        folded into copies of the model's stream-layer projections, and every stream-layer
        linear (and the draft head, `DraftHead`) in `dtype` (default: the model's). This
        object stays trainable.

        The copy drafts what this one drafts up to rounding; it cannot be trained or saved.
        """
        dtype = dtype or model.dtype
        merged = copy.deepcopy(self)
        if len(self.adapters) or dtype != model.dtype:
            layers = model.layers[self.split :]
            adapters = list(self.adapters) or [None] * len(layers)
            merged.adapters = nn.ModuleList(
                MergedStreamLayer(block, adapter, dtype)
                for block, adapter in zip(layers, adapters, strict=True)
            )
        merged.draft_dtype = dtype
        merged.requires_grad_(False)
        return merged

    @property
    def token_aware(self) -> bool:
        return self.next_token is not None

    def start(self, hidden: Tensor, next_embedding: Tensor | None = None) -> Tensor:
        """Stream inputs (B, n, gamma, dim) from main hidden states (B, n, dim) at layer split.

        next_embedding (B, n, dim): input embeddings of each node's next token (the main
        stream's greedy choice there), required by token-aware streams.
        """
        if self.next_token is not None:
            if next_embedding is None:
                raise ValueError("token-aware streams need the next token's embedding")
            weight_dtype = self.next_token.up.weight.dtype
            hidden = hidden + self.next_token(next_embedding.to(weight_dtype)).to(hidden.dtype)
        return hidden[:, :, None, :] + self.embeddings.to(hidden.dtype)


def stream_mask(node_mask: Tensor, n_streams: int) -> Tensor:
    """Mask for stream rows: each node's main-stream view, then streams <= j of the same node.

    node_mask: (B, 1, n, S) bool, the main-stream mask rows of the n nodes that get streams.
    Returns (B, 1, n * gamma, S + n * gamma), rows and stream keys ordered node-major.

    >>> stream_mask(torch.tensor([[[[True, False], [True, True]]]]), 2)[0, 0].int()
    tensor([[1, 0, 1, 0, 0, 0],
            [1, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 1, 0, 0, 1, 1]], dtype=torch.int32)
    """
    B, _, n, _S = node_mask.shape
    main_part = node_mask.repeat_interleave(n_streams, dim=2)  # (B, 1, n*g, S)
    within_node = torch.ones(n_streams, n_streams, dtype=torch.bool).tril()
    stream_part = torch.block_diag(*[within_node] * n) if n else torch.zeros(0, 0, dtype=torch.bool)
    stream_part = stream_part.expand(B, 1, n * n_streams, n * n_streams)
    return torch.cat([main_part, stream_part], dim=-1)


def stream_layer(
    block: Block,
    adapter: StreamAdapter | MergedStreamLayer | None,
    s: Tensor,
    rope: tuple[Tensor, Tensor],
    mask: Tensor,
    cache: KVCache,
    layer: int,
    n_slots: int,
) -> Tensor:
    """One MSA layer for stream rows s (B, R, dim), R = nodes * gamma, node-major.

    Stream rows read the main stream's keys/values of this layer from slots [0, n_slots) of the
    cache (already written by the main rows) and their own keys; they write nothing.
    mask: (B, 1, R, n_slots + R) from `stream_mask`. Returns the new s (B, R, dim).
    """
    attn = block.attention
    B, R, _ = s.shape
    q_size, kv_size = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
    h = block.attention_norm(s)
    qkv = attn.wqkv(h) if adapter is None else adapter.project_qkv(block, h)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(B, R, attn.n_heads, attn.head_dim).transpose(1, 2)  # (B, H, R, hd)
    k = k.view(B, R, attn.n_kv_heads, attn.head_dim).transpose(1, 2)  # (B, Hkv, R, hd)
    v = v.view(B, R, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    cos, sin = rope
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    main_k = cache.k[layer][:B, :, :n_slots]
    main_v = cache.v[layer][:B, :, :n_slots]
    keys = torch.cat([main_k, k], dim=2)  # (B, Hkv, n_slots + R, hd)
    values = torch.cat([main_v, v], dim=2)
    out = grouped_query_attention(q, keys, values, mask)
    out = out.transpose(1, 2).reshape(B, R, q_size)  # (B, R, H * hd)
    s = s + (attn.wo(out) if adapter is None else adapter.project_out(block, out))
    h = block.ffn_norm(s)
    return s + (block.feed_forward(h) if adapter is None else adapter.feed_forward(block, h))


@dataclass
class StreamOutput:
    main_logits: Tensor  # (B, T, vocab) float32: the base model's logits at every new token
    split_hidden: Tensor  # (B, T, dim) main hidden states entering the first MSA layer
    stream_hidden: Tensor  # (B, n, gamma, dim) final-norm stream states at the chosen nodes


class DraftHead:
    """The LM head the streams draft with: the model's own, restricted to the draft vocabulary,
    in the streams' drafting dtype (`SpeculativeStreams.merged_for`).

    Only the node that was accepted last needs draft logits: running the LM head for every
    node's streams would cost more than the streams themselves.
    """

    def __init__(self, model: Transformer, streams: SpeculativeStreams) -> None:
        weight_dtype = streams.draft_dtype or model.dtype
        self.dtype = compute_dtype(weight_dtype)  # of the states in, and of context rows
        self.vocab: Tensor | None = None
        if not streams.config.draft_vocab_size:  # the whole vocabulary: the model's own head
            self.head: nn.Module = _converted(model.output, weight_dtype)
            return
        self.vocab = streams.draft_vocab
        self.model_rows = model.lm_head_weight()  # (V, dim): rows for context tokens
        self.in_vocab = frozenset(self.vocab.tolist())
        # (V_d, dim) rows, a copy
        self.head = _inference_linear(self.model_rows[self.vocab], weight_dtype, pack=True)

    def context(self, tokens: list[int]) -> ContextTokens | None:
        """A request's context vocabulary, starting from its prompt; None where the streams
        draft over the whole vocabulary anyway."""
        if self.vocab is None:
            return None
        context = ContextTokens(self)
        context.add(tokens)
        return context

    def top_k(
        self, stream_hidden: Tensor, k: int, context: ContextTokens | None = None
    ) -> tuple[Tensor, Tensor]:
        """(gamma, dim) final-norm states -> top-k token ids and log-probabilities (gamma, k),
        among the draft vocabulary and the `context` tokens outside it."""
        hidden = stream_hidden.to(self.dtype)
        logits = self.head(hidden)
        ids = self.vocab
        if context is not None and context.ids:
            logits = torch.cat([logits, nn.functional.linear(hidden, context.rows)], -1)
            ids = context.all_ids
        log_probs, index = torch.log_softmax(logits.float(), -1).topk(k, -1)
        tokens = index if ids is None else ids[index]
        return tokens, log_probs


class ContextTokens:
    """The tokens a request has already seen (prompt, answer so far) that the draft vocabulary
    lacks, drafted too: answers repeat their prompts' names and terms, which a vocabulary of
    frequent answer tokens misses. Measured on 1,399 distilled answers: 7.7% of answer tokens
    are outside the 8,192-token draft vocabulary, and 79% of those were already in the context.
    Their rows are the model's own LM head rows, the head the streams were trained through, so
    the streams' states score them as they score any token; a row costs one dot product.
    """

    def __init__(self, head: DraftHead) -> None:
        self.head = head
        self.ids: list[int] = []
        self.held: set[int] = set()  # self.ids, for membership on every pass
        self.rows = torch.zeros(0, head.model_rows.shape[1], dtype=head.dtype)
        self.all_ids = head.vocab  # draft vocabulary, then self.ids: the ids of logit columns

    def add(self, tokens: list[int]) -> None:
        """Take in tokens the request has seen; those outside the draft vocabulary and not yet
        held become draftable."""
        new = [
            t for t in dict.fromkeys(tokens) if t not in self.held and t not in self.head.in_vocab
        ]
        if not new:
            return
        self.ids += new
        self.held.update(new)
        rows = self.head.model_rows[new].to(self.head.dtype)
        self.rows = torch.cat([self.rows, rows])
        self.all_ids = torch.cat([self.all_ids, torch.tensor(new, dtype=self.all_ids.dtype)])


def stream_inputs(
    model: Transformer,
    streams: SpeculativeStreams,
    start_hidden: Tensor,
    node_positions: Tensor,
    node_mask: Tensor,
    next_tokens: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor]:
    """Stream rows, their RoPE tables and mask for n nodes, at the first MSA layer.

    start_hidden (B, n, dim) main states entering layer `split`; node_positions (B, n);
    node_mask (B, 1, n, S) the nodes' main-stream mask rows; next_tokens (B, n) the main
    stream's next token at each node (token-aware streams). Returns s (B, n*gamma, dim),
    node-major. Stream j of a node at position p gets RoPE position p + j, that of the token
    it stands for.
    """
    B, n, dim = start_hidden.shape
    gamma = streams.config.n_streams
    stream_pos = (node_positions[:, :, None] + torch.arange(1, gamma + 1)).reshape(B, -1)
    # Near the end of the context a stream may stand for a position past it; its draft is
    # never used there (no budget left), so any valid RoPE position will do.
    rope = model.rope(stream_pos.clamp(max=model.config.max_position - 1), model.dtype)
    next_embedding = None if next_tokens is None else model.tok_embeddings(next_tokens)
    s = streams.start(start_hidden, next_embedding).reshape(B, n * gamma, dim)
    return s, rope, stream_mask(node_mask, gamma)


def adapter_for(
    streams: SpeculativeStreams, layer: int
) -> StreamAdapter | MergedStreamLayer | None:
    return streams.adapters[layer - streams.split] if len(streams.adapters) else None


def ss_forward(
    model: Transformer,
    streams: SpeculativeStreams,
    tokens: Tensor,
    cache: KVCache,
    positions: Tensor | None = None,
    mask: Tensor | None = None,
    stream_nodes: Tensor | None = None,
) -> StreamOutput:
    """One pass: the base model over new tokens (cache appended) plus streams at chosen nodes.

    tokens, positions, mask as in `Transformer.hidden_states`. stream_nodes: 1-D indices into
    the T new tokens whose streams to run in this same pass (default: all; empty: none, e.g.
    when `stream_pass` runs them later for the accepted node only). Each MSA layer runs the
    main rows, then the stream rows while the layer's weights are still in the CPU cache.
    """
    B, T = tokens.shape
    start = cache.length
    x, rope, mask4 = model.prepare(tokens, cache, positions, mask)
    positions = (torch.arange(start, start + T) if positions is None else positions).expand(B, T)
    if mask4 is None:  # a single new token sees every slot
        mask4 = torch.ones(1, 1, T, start + T, dtype=torch.bool)
    nodes = torch.arange(T) if stream_nodes is None else stream_nodes
    if len(nodes) and streams.token_aware:
        raise ValueError(
            "token-aware streams need each node's next token, known only after verification: "
            "run them with stream_pass (placement 'accepted')"
        )
    gamma, dim = streams.config.n_streams, model.config.dim
    split_hidden, s = x, None
    for i, block in enumerate(model.layers):
        if i == streams.split:
            split_hidden = x
            if len(nodes):
                node_mask = mask4[:, :, nodes].expand(B, 1, -1, -1)
                s, srope, smask = stream_inputs(
                    model, streams, x[:, nodes], positions[:, nodes], node_mask
                )
        x = block(x, rope, mask4, cache, i)
        if s is not None:
            s = stream_layer(block, adapter_for(streams, i), s, srope, smask, cache, i, start + T)
    cache.length = start + T
    main_logits = model.output(model.norm(x)).float()
    if s is None:
        stream_hidden = x.new_zeros(B, 0, gamma, dim)
    else:
        stream_hidden = model.norm(s).view(B, len(nodes), gamma, dim)
    return StreamOutput(main_logits, split_hidden, stream_hidden)


def stream_pass(
    model: Transformer,
    streams: SpeculativeStreams,
    split_hidden: Tensor,
    position: int,
    cache: KVCache,
    next_token: int,
) -> Tensor:
    """Streams of the newest cached token only, after verification: (B, gamma, dim).

    split_hidden (B, dim) is that token's state entering the first MSA layer; it sits at the
    last cache slot, so its streams see every cached main key. next_token is the main
    stream's greedy choice after it (the next tree's root), which token-aware streams read.
    Runs only the top N_s layers for gamma rows, instead of streams at every tree node inside
    the verification pass.
    """
    B, n_slots = split_hidden.shape[0], cache.length
    node_mask = torch.ones(B, 1, 1, n_slots, dtype=torch.bool)
    node_positions = torch.full((B, 1), position)
    next_tokens = torch.full((B, 1), next_token) if streams.token_aware else None
    s, rope, mask = stream_inputs(
        model, streams, split_hidden[:, None], node_positions, node_mask, next_tokens
    )
    for i in range(streams.split, model.config.n_layers):
        s = stream_layer(model.layers[i], adapter_for(streams, i), s, rope, mask, cache, i, n_slots)
    return model.norm(s)  # (B, gamma, dim)


def save_streams(streams: SpeculativeStreams, path: Path, info: dict[str, object]) -> None:
    """Write stream weights as safetensors, with their config and `info` (JSON) as metadata."""
    if any(isinstance(a, MergedStreamLayer) for a in streams.adapters):
        raise ValueError("streams merged for inference cannot be saved: save the ones merged")
    save_weights(streams, path, "stream_config", streams.config.to_dict(), info)


def load_streams(
    path: Path, model: Transformer, dtype: torch.dtype | None = None
) -> tuple[SpeculativeStreams, dict[str, object]]:
    """Streams saved by `save_streams`, in the model's dtype (or `dtype`:
    float32 to train them further), plus their `info` metadata."""
    return load_drafter(
        path,
        "stream_config",
        "stream weights",
        lambda c: SpeculativeStreams(model.config, StreamConfig(**c)),
        dtype or model.dtype,
    )
