"""Prompt lookup drafting (Saxena, 2023): the tokens that followed the latest earlier occurrence
of the last few tokens, in the prompt or the output so far. No parameters, no model call; it
drafts well where an answer copies its input (translation, extraction, data-to-text) and not
at all elsewhere. `generate_pld` verifies such a draft on its own; Speculative Streaming can
graft it onto its stream tree (`generate_ss(lookup_tokens=...)`).
"""

from __future__ import annotations


def prompt_lookup_draft(
    context: list[int], max_ngram: int, num_draft: int, min_ngram: int = 1
) -> list[int]:
    """Up to `num_draft` tokens that followed the latest earlier match of the context's last
    n tokens, trying n = max_ngram down to min_ngram; [] when nothing matches.

    >>> prompt_lookup_draft([1, 2, 3, 4, 9, 1, 2], max_ngram=2, num_draft=3)
    [3, 4, 9]
    >>> prompt_lookup_draft([5, 6, 7], max_ngram=2, num_draft=3)
    []
    >>> prompt_lookup_draft([1, 2, 3, 4, 9, 2], max_ngram=3, num_draft=3, min_ngram=2)
    []
    """
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # latest match first
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + num_draft]
                if follow:
                    return follow
    return []
