"""The decoding loops: autoregressive (the baseline) and Speculative Streaming.

`generate_ar` runs one forward pass per new token over a preallocated KV cache: greedy by
default, temperature and nucleus (top-p) sampling with a seeded generator when asked.

`generate_ss` runs one pass per draft tree: the pass verifies the tree drafted by the previous
pass (the main stream's choice at each node) and the speculative streams draft the next tree
from the last accepted node. Every emitted token is the base model's own choice (greedy, or
sampled from its distribution), so the output is `generate_ar`'s.

Both count forward passes, so mean accepted tokens per pass compare on the same footing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor

from edgestream.llm.lookup import prompt_lookup_draft
from edgestream.llm.model import Transformer
from edgestream.llm.msa import DraftHead, SpeculativeStreams, ss_forward, stream_pass
from edgestream.llm.tree import DraftTree, TreeShape, accept, build_tree, graft_chain, tree_mask

TokenCallback = Callable[[int], None]


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy when temperature is 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class TokenPicker:
    """Chooses tokens from logits according to a `Sampling`, with its own random generator."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.generator = torch.Generator()
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        else:
            self.generator.seed()

    def __call__(self, logits: Tensor) -> int:
        """logits (vocab,) float32 -> token id. `.item()` is a host sync, needed to stop at EOS."""
        if self.sampling.greedy:
            return int(logits.argmax())
        probs = torch.softmax(logits / self.sampling.temperature, dim=-1)
        if self.sampling.top_p < 1:
            probs = _top_p_filter(probs, self.sampling.top_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def accept(self, tree: DraftTree, logits: Tensor) -> tuple[list[int], int]:
        """The accepted path through a verified tree and the token after it (`tree.accept`).

        logits (T, vocab): the base model's logits after every node. Greedy takes every
        node's argmax in one host sync; sampling draws only at the nodes on the path, one
        draw per emitted token in order, exactly as `generate_ar` draws them, so with the
        same seed the output is the same sequence (up to float rounding of the logits).
        """
        if self.sampling.greedy:
            return accept(tree, logits.argmax(-1).tolist().__getitem__)
        return accept(tree, lambda node: self(logits[node]))


def _top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (renormalised)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum()


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only, including a final stop token if one was produced
    forward_passes: int  # model calls, prefill included
    seconds: float  # wall time, prefill included
    finish_reason: str  # "stop" (a stop token), "length" (max_new_tokens) or "context" (full)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """New tokens per forward pass: 1.0 for autoregressive decoding."""
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0


def check_request(
    prompt_ids: list[int], max_new_tokens: int, context_length: int, vocab_size: int | None = None
) -> int:
    """Validate a request; return how many new tokens fit in the context (<= max_new_tokens)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if vocab_size is not None:
        bad = [t for t in prompt_ids if not isinstance(t, Integral) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids must be integers in [0, {vocab_size}), got {bad[0]!r}"
            )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(prompt_ids) >= context_length:
        raise ValueError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {context_length}"
        )
    return min(max_new_tokens, context_length - len(prompt_ids))


@torch.inference_mode()
def generate_ar(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    sampling: Sampling = Sampling(),
    on_token: TokenCallback | None = None,
) -> GenerationResult:
    """Decode one token per forward pass until a stop token, max_new_tokens or the context end."""
    budget = check_request(
        prompt_ids, max_new_tokens, model.config.max_position, model.config.vocab_size
    )
    pick = TokenPicker(sampling)
    start = time.perf_counter()
    cache = model.new_cache(len(prompt_ids) + budget)
    logits = model(torch.tensor([prompt_ids]), cache, last_only=True)
    passes, new_ids = 1, []
    while True:
        token = pick(logits[0, -1])
        new_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids or len(new_ids) == budget:
            break
        logits = model(torch.tensor([[token]]), cache)
        passes += 1
    seconds = time.perf_counter() - start
    if new_ids[-1] in stop_ids:
        reason = "stop"
    else:
        reason = "length" if budget == max_new_tokens else "context"
    return GenerationResult(new_ids, passes, seconds, reason)


class Emitter:
    """Collects emitted tokens and decides when to stop (a stop token or the budget)."""

    def __init__(self, budget: int, stop_ids: Collection[int], on_token: TokenCallback | None):
        self.budget, self.stop_ids, self.on_token = budget, stop_ids, on_token
        self.ids: list[int] = []
        self.done = False

    def emit(self, tokens: list[int]) -> None:
        for token in tokens:
            self.ids.append(token)
            if self.on_token is not None:
                self.on_token(token)
            if token in self.stop_ids or len(self.ids) == self.budget:
                self.done = True
                return

    @property
    def remaining(self) -> int:
        return self.budget - len(self.ids)

    def finish_reason(self, max_new_tokens: int) -> str:
        if self.ids[-1] in self.stop_ids:
            return "stop"
        return "length" if self.budget == max_new_tokens else "context"


STREAM_PLACEMENTS = ("accepted", "all")


@torch.inference_mode()
def generate_ss(
    model: Transformer,
    streams: SpeculativeStreams,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    shape: TreeShape = TreeShape(),
    on_token: TokenCallback | None = None,
    placement: str = "accepted",
    head: DraftHead | None = None,
    sampling: Sampling = Sampling(),
    lookup_tokens: int = 0,
    lookup_ngram: int = 3,
    lookup_alone_ngram: int = 0,
    context_drafts: bool = True,
) -> GenerationResult:
    """Speculative Streaming decoding; the output is `generate_ar`'s: token for token when
    greedy, the same distribution when sampling (the same tokens for the same seed).

    `lookup_tokens` > 0 grafts a prompt lookup draft of up to that many tokens (n-grams of
    at most `lookup_ngram`) onto every stream tree, verified in the same pass: the streams
    draft what the model would say, the lookup what the prompt already holds.
    `lookup_alone_ngram` > 0 goes further: when the last `lookup_alone_ngram` or more tokens
    recur earlier, the lookup draft is verified alone, as a chain, and the stream pass is
    skipped for it (where the answer copies its input, that is the cheapest pass there is);
    the streams draft wherever there is nothing to copy.

    placement "all" is the paper's layout: streams run at every tree node inside the
    verification pass and the last accepted node's drafts are kept. "accepted" runs the
    streams after verification, for the last accepted node only (the top N_s layers for gamma
    rows); on a CPU that costs less than streams at every node. Forward passes count the
    verification passes; the "accepted" stream runs are a fraction of a pass each.
    `head` is the streams' draft head, built here when not given (pass one to reuse it).
    `context_drafts` lets the streams draft the prompt's and the answer's tokens that their
    draft vocabulary lacks (`msa.ContextTokens`).
    """
    if placement not in STREAM_PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: expected {STREAM_PLACEMENTS}")
    if lookup_tokens < 0 or lookup_ngram < 1 or not 0 <= lookup_alone_ngram <= lookup_ngram:
        raise ValueError(
            "expected lookup_tokens >= 0, lookup_ngram >= 1 and 0 <= lookup_alone_ngram <= "
            f"lookup_ngram, got {lookup_tokens}, {lookup_ngram}, {lookup_alone_ngram}"
        )
    if lookup_alone_ngram and not lookup_tokens:
        raise ValueError("lookup_alone_ngram needs lookup_tokens > 0")
    in_pass = placement == "all"
    budget = check_request(
        prompt_ids, max_new_tokens, model.config.max_position, model.config.vocab_size
    )
    out = Emitter(budget, stop_ids, on_token)
    pick = TokenPicker(sampling)
    k = max(shape.top_k)
    start = time.perf_counter()
    head = head or DraftHead(model, streams)
    cache = model.new_cache(len(prompt_ids) + budget + shape.max_nodes + lookup_tokens)
    P = len(prompt_ids)
    nodes = torch.tensor([P - 1]) if in_pass else torch.zeros(0, dtype=torch.long)
    step = ss_forward(model, streams, torch.tensor([prompt_ids]), cache, stream_nodes=nodes)
    passes = 1
    root = pick(step.main_logits[0, -1])  # host sync: the root decides the tree
    seen = head.context([*prompt_ids, root]) if context_drafts else None
    if in_pass:
        drafts = step.stream_hidden[0, 0]
    else:
        drafts = stream_pass(model, streams, step.split_hidden[:, -1], P - 1, cache, root)[0]
    candidates, log_probs = head.top_k(drafts, k, seen)
    out.emit([root])
    alone: list[int] = []  # a lookup draft to verify without a stream tree
    while not out.done:
        # The root is certain but not yet in the cache; a node at depth d would emit d + 1
        # tokens, so the tree never grows deeper than the budget left.
        depth_left = out.remaining - 1
        if alone:
            tree = DraftTree.chain([root, *alone])
        else:
            depth = min(len(shape.top_k), depth_left)
            tree = build_tree(root, candidates[:depth], log_probs[:depth], shape)
            if lookup_tokens:
                context = prompt_ids + out.ids  # ends with the root
                chain = prompt_lookup_draft(context, lookup_ngram, min(lookup_tokens, depth_left))
                tree = graft_chain(tree, chain)
        prefix = cache.length
        step = ss_forward(
            model,
            streams,
            torch.tensor([tree.tokens]),
            cache,
            positions=prefix + torch.tensor(tree.depths),
            mask=tree_mask(tree, prefix),
            stream_nodes=None if in_pass else torch.zeros(0, dtype=torch.long),
        )
        passes += 1
        path, root = pick.accept(tree, step.main_logits[0])
        last = path[-1]
        emitted = [tree.tokens[n] for n in path[1:]] + [root]
        out.emit(emitted)
        if seen is not None:
            seen.add(emitted)
        cache.compact(prefix + torch.tensor(path), prefix)
        if out.done:
            break
        if lookup_alone_ngram:
            context, longest = prompt_ids + out.ids, min(lookup_tokens, out.remaining - 1)
            alone = prompt_lookup_draft(context, lookup_ngram, longest, lookup_alone_ngram)
            if alone:
                continue  # the next pass verifies the lookup draft alone: no drafts needed
        if in_pass:
            drafts = step.stream_hidden[0, last]
        else:
            position = prefix + tree.depths[last]
            drafts = stream_pass(model, streams, step.split_hidden[:, last], position, cache, root)[
                0
            ]
        candidates, log_probs = head.top_k(drafts, k, seen)
    seconds = time.perf_counter() - start
    return GenerationResult(out.ids, passes, seconds, out.finish_reason(max_new_tokens))


@torch.inference_mode()
def generate_batch_greedy(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    pad_id: int = 0,
) -> list[list[int]]:
    """Greedy continuations of several prompts at once, for throughput (e.g. distillation).

    Prompts are left-padded to one length; each row gets its own positions and a mask that
    hides its padding. A row stops at its first stop token (kept); all stop together at
    max_new_tokens. Batched matmuls round differently from batch size 1, so near-ties may
    resolve differently from `generate_ar`: use this for data, not as the lossless oracle.
    """
    if not prompts or any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    B, P = len(prompts), max(len(p) for p in prompts)
    budget = min(max_new_tokens, model.config.max_position - P)
    if budget < 1:
        raise ValueError(f"the longest prompt ({P} tokens) leaves no room in the context")
    pads = torch.tensor([P - len(p) for p in prompts])
    tokens = torch.tensor([[pad_id] * (P - len(p)) + p for p in prompts])
    cache = model.new_cache(P + budget, batch_size=B)
    slots = torch.arange(P)
    real_key = slots[None, :] >= pads[:, None]  # (B, P): False on padding
    # Padding rows attend to themselves only, so no softmax row is empty (that would be NaN).
    mask = (slots[None, :, None] >= slots[None, None, :]) & real_key[:, None, :]
    mask = (mask | torch.eye(P, dtype=torch.bool))[:, None]  # (B, 1, P, P)
    positions = (slots[None, :] - pads[:, None]).clamp(min=0)
    logits = model(tokens, cache, positions=positions, mask=mask, last_only=True)
    outputs: list[list[int]] = [[] for _ in prompts]
    finished = [False] * B
    for step in range(budget):
        next_tokens = logits[:, -1].argmax(-1).tolist()  # host sync, once per step
        for row, token in enumerate(next_tokens):
            if not finished[row]:
                outputs[row].append(token)
                finished[row] = token in stop_ids
        if all(finished) or step == budget - 1:
            break
        key_ok = torch.cat([real_key, torch.ones(B, step + 1, dtype=torch.bool)], dim=1)
        logits = model(
            torch.tensor(next_tokens)[:, None],
            cache,
            positions=(P + step - pads)[:, None],
            mask=key_ok[:, None, None, :],
        )
    return outputs
