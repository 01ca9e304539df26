"""Baselines that Speculative Streaming is measured against, run by our own engine.

Prompt lookup decoding (Saxena, 2023; transformers' `prompt_lookup_num_tokens`): the draft is
whatever followed the most recent earlier occurrence of the last few tokens, in the prompt or
the output so far. It needs no extra parameters, and wins where the answer copies its input
(summaries, extraction, code edits). The draft is a chain, verified in one forward pass under
the ordinary causal mask; the accepted prefix stays in the KV cache and the rest is rolled
back, so greedy output is the autoregressive output token for token.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import torch

from edgestream.llm.engine import Emitter, GenerationResult, TokenCallback, check_request
from edgestream.llm.model import Transformer


def prompt_lookup_draft(context: list[int], max_ngram: int, num_draft: int) -> list[int]:
    """Up to `num_draft` tokens that followed the latest earlier match of the context's last
    n tokens, trying n = max_ngram down to 1; [] when nothing matches.

    >>> prompt_lookup_draft([1, 2, 3, 4, 9, 1, 2], max_ngram=2, num_draft=3)
    [3, 4, 9]
    >>> prompt_lookup_draft([5, 6, 7], max_ngram=2, num_draft=3)
    []
    """
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # latest match first
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + num_draft]
                if follow:
                    return follow
    return []


@torch.inference_mode()
def generate_pld(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    num_draft: int = 10,
    max_ngram: int = 3,
    on_token: TokenCallback | None = None,
) -> GenerationResult:
    """Greedy prompt lookup decoding; the output equals `generate_ar`'s greedy output."""
    if num_draft < 1 or max_ngram < 1:
        raise ValueError(f"expected num_draft, max_ngram >= 1, got {num_draft}, {max_ngram}")
    budget = check_request(prompt_ids, max_new_tokens, model.config.max_position)
    out = Emitter(budget, stop_ids, on_token)
    start = time.perf_counter()
    cache = model.new_cache(len(prompt_ids) + budget + num_draft)
    logits = model(torch.tensor([prompt_ids]), cache, last_only=True)
    passes = 1
    out.emit([int(logits[0, -1].argmax())])
    while not out.done:
        # The last emitted token is not in the cache yet: it leads the chain. A draft longer
        # than the budget left could only be cut off after verification.
        draft = prompt_lookup_draft(prompt_ids + out.ids, max_ngram, num_draft)
        draft = draft[: out.remaining - 1]
        prefix = cache.length
        logits = model(torch.tensor([[out.ids[-1], *draft]]), cache)
        passes += 1
        greedy = logits[0].argmax(-1).tolist()  # host sync, once per pass
        accepted = 0
        while accepted < len(draft) and draft[accepted] == greedy[accepted]:
            accepted += 1
        cache.rollback(prefix + 1 + accepted)  # the leading token and the accepted drafts stay
        out.emit([*draft[:accepted], greedy[accepted]])
    seconds = time.perf_counter() - start
    return GenerationResult(out.ids, passes, seconds, out.finish_reason(max_new_tokens))
