"""Baselines that Speculative Streaming is measured against, run by our own engine.

Medusa-1 (`generate_medusa`, heads in `medusa`): extra heads on the last hidden state draft the
next tokens; the same draft trees, tree mask and acceptance as Speculative Streaming.

Two-model speculative decoding (`generate_draft`, the draft model in `draft`): a small model
drafts a chain token by token; the base model verifies it in one pass.

Prompt lookup decoding (Saxena, 2023; transformers' `prompt_lookup_num_tokens`): the draft is
whatever followed the most recent earlier occurrence of the last few tokens, in the prompt or
the output so far. It needs no extra parameters, and wins where the answer copies its input
(summaries, extraction, code edits). The draft is a chain, verified in one forward pass under
the ordinary causal mask; the accepted prefix stays in the KV cache and the rest is rolled
back, so greedy output is the autoregressive output token for token.

Both sample too (temperature > 0) with the base model's own distribution: see `tree.accept`.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import torch

from edgestream.llm.engine import (
    Emitter,
    GenerationResult,
    Sampling,
    TokenCallback,
    TokenPicker,
    check_request,
)
from edgestream.llm.lookup import prompt_lookup_draft
from edgestream.llm.medusa import MedusaHeads
from edgestream.llm.model import KVCache, Transformer
from edgestream.llm.tree import DraftTree, TreeShape, build_tree, tree_mask


@torch.inference_mode()
def generate_pld(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    num_draft: int = 10,
    max_ngram: int = 3,
    on_token: TokenCallback | None = None,
    sampling: Sampling = Sampling(),
) -> GenerationResult:
    """Prompt lookup decoding; the output is `generate_ar`'s (see `generate_ss`)."""
    if num_draft < 1 or max_ngram < 1:
        raise ValueError(f"expected num_draft, max_ngram >= 1, got {num_draft}, {max_ngram}")
    budget = check_request(
        prompt_ids, max_new_tokens, model.config.max_position, model.config.vocab_size
    )
    out = Emitter(budget, stop_ids, on_token)
    pick = TokenPicker(sampling)
    start = time.perf_counter()
    cache = model.new_cache(len(prompt_ids) + budget + num_draft)
    logits = model(torch.tensor([prompt_ids]), cache, last_only=True)
    passes = 1
    out.emit([pick(logits[0, -1])])
    while not out.done:
        # The last emitted token is not in the cache yet: it leads the chain. A draft longer
        # than the budget left could only be cut off after verification.
        draft = prompt_lookup_draft(prompt_ids + out.ids, max_ngram, num_draft)
        draft = draft[: out.remaining - 1]
        prefix = cache.length
        chain = DraftTree.chain([out.ids[-1], *draft])
        logits = model(torch.tensor([chain.tokens]), cache)
        passes += 1
        path, token = pick.accept(chain, logits[0])
        accepted = len(path) - 1
        cache.rollback(prefix + 1 + accepted)  # the leading token and the accepted drafts stay
        out.emit([*draft[:accepted], token])
    seconds = time.perf_counter() - start
    return GenerationResult(out.ids, passes, seconds, out.finish_reason(max_new_tokens))


@torch.inference_mode()
def generate_medusa(
    model: Transformer,
    heads: MedusaHeads,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    shape: TreeShape = TreeShape(),
    on_token: TokenCallback | None = None,
    sampling: Sampling = Sampling(),
) -> GenerationResult:
    """Medusa-1 decoding; the output is `generate_ar`'s (see `generate_ss`).

    One pass per tree: it verifies the tree the heads drafted from the last accepted node, and
    its final hidden state at the newly accepted node feeds the heads for the next tree.
    """
    budget = check_request(
        prompt_ids, max_new_tokens, model.config.max_position, model.config.vocab_size
    )
    out = Emitter(budget, stop_ids, on_token)
    pick = TokenPicker(sampling)
    k = max(shape.top_k)
    start = time.perf_counter()
    cache = model.new_cache(len(prompt_ids) + budget + shape.max_nodes)
    hidden = model.hidden_states(torch.tensor([prompt_ids]), cache)[0, -1]
    passes = 1
    root = pick(model.output(hidden).float())
    out.emit([root])
    while not out.done:
        candidates, log_probs = heads.top_k(hidden, k)
        # The root is certain but not yet in the cache: see generate_ss.
        depth = min(len(shape.top_k), out.remaining - 1)
        tree = build_tree(root, candidates[:depth], log_probs[:depth], shape)
        prefix = cache.length
        nodes = model.hidden_states(
            torch.tensor([tree.tokens]),
            cache,
            positions=prefix + torch.tensor(tree.depths),
            mask=tree_mask(tree, prefix),
        )[0]
        passes += 1
        path, root = pick.accept(tree, model.output(nodes).float())
        out.emit([tree.tokens[n] for n in path[1:]] + [root])
        cache.compact(prefix + torch.tensor(path), prefix)
        hidden = nodes[path[-1]]
    seconds = time.perf_counter() - start
    return GenerationResult(out.ids, passes, seconds, out.finish_reason(max_new_tokens))


@torch.inference_mode()
def generate_draft(
    model: Transformer,
    draft: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    num_draft: int = 4,
    on_token: TokenCallback | None = None,
    sampling: Sampling = Sampling(),
) -> GenerationResult:
    """Two-model speculative decoding with greedy drafts; the output is `generate_ar`'s.

    Forward passes count the base model's passes only (the draft's are cheaper and are in the
    wall time), so mean accepted tokens compare with the single-model methods.
    """
    if num_draft < 1:
        raise ValueError(f"num_draft must be >= 1, got {num_draft}")
    budget = check_request(
        prompt_ids, max_new_tokens, model.config.max_position, model.config.vocab_size
    )
    out = Emitter(budget, stop_ids, on_token)
    pick = TokenPicker(sampling)
    start = time.perf_counter()
    capacity = len(prompt_ids) + budget + num_draft
    cache, draft_cache = model.new_cache(capacity), draft.new_cache(capacity)
    logits = model(torch.tensor([prompt_ids]), cache, last_only=True)
    passes = 1
    out.emit([pick(logits[0, -1])])
    while not out.done:
        sequence = prompt_ids + out.ids  # the last token is in neither cache yet
        chain = _draft_chain(draft, draft_cache, sequence, min(num_draft, out.remaining - 1))
        prefix = cache.length
        tree = DraftTree.chain([out.ids[-1], *chain])
        logits = model(torch.tensor([tree.tokens]), cache)
        passes += 1
        path, token = pick.accept(tree, logits[0])
        accepted = len(path) - 1
        cache.rollback(prefix + 1 + accepted)
        # The draft cached the chain except its last token; keep what was accepted.
        draft_cache.rollback(min(draft_cache.length, prefix + 1 + accepted))
        out.emit([*chain[:accepted], token])
    seconds = time.perf_counter() - start
    return GenerationResult(out.ids, passes, seconds, out.finish_reason(max_new_tokens))


def _draft_chain(draft: Transformer, cache: KVCache, sequence: list[int], n: int) -> list[int]:
    """n greedy draft tokens after `sequence`; the draft's cache catches up on what it lacks
    (the tokens emitted since it last ran) in the first call."""
    chain: list[int] = []
    pending = sequence[cache.length :]
    for _ in range(n):
        logits = draft(torch.tensor([pending]), cache, last_only=True)
        chain.append(int(logits[0, -1].argmax()))  # host sync per draft token
        pending = chain[-1:]
    return chain
