"""Prompt lookup decoding: lossless against AR, drafts that pay off on repetitive text."""

from __future__ import annotations

import pytest
import torch

from edgestream.llm.baselines import generate_pld
from edgestream.llm.engine import generate_ar
from edgestream.llm.lookup import prompt_lookup_draft
from edgestream.llm.model import Transformer
from tests.conftest import tiny_llama


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_hf(tiny_llama(max_position=128))


def _prompt(n: int, seed: int, vocab: int = 300) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=generator).tolist()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("num_draft", "max_ngram"), [(10, 3), (2, 1), (5, 2)])
def test_prompt_lookup_is_lossless(
    model: Transformer, seed: int, num_draft: int, max_ngram: int
) -> None:
    # A prompt over few distinct tokens repeats itself, so lookups find drafts.
    prompt = _prompt(30, seed, vocab=12) + _prompt(10, seed)
    ar = generate_ar(model, prompt, 40)
    pld = generate_pld(model, prompt, 40, num_draft=num_draft, max_ngram=max_ngram)
    assert pld.token_ids == ar.token_ids
    assert pld.forward_passes <= ar.forward_passes


def test_repetitive_output_is_decoded_in_fewer_passes(model: Transformer) -> None:
    # Greedy decoding of a tiny random model falls into loops; lookups then draft them whole.
    prompt = _prompt(8, 11)
    ar = generate_ar(model, prompt, 100)
    tail = ar.token_ids[-20:]
    assert len(set(tail)) < 15, "expected the tiny model to loop (test premise)"
    pld = generate_pld(model, prompt, 100)
    assert pld.token_ids == ar.token_ids
    assert pld.forward_passes < 0.7 * ar.forward_passes


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_stops_and_budgets_are_exact(model: Transformer, max_new: int) -> None:
    prompt = _prompt(20, 3, vocab=8)
    free = generate_ar(model, prompt, 40).token_ids
    assert generate_pld(model, prompt, max_new).token_ids == free[:max_new]
    stop = free[12]
    stopped = generate_pld(model, prompt, 40, stop_ids={stop})
    assert stopped.token_ids == free[: free.index(stop) + 1] and stopped.finish_reason == "stop"
    end = generate_pld(model, _prompt(120, 4, vocab=8), 50)
    assert end.finish_reason == "context" and end.new_tokens == 8


def test_draft_prefers_the_longest_latest_match() -> None:
    context = [7, 1, 2, 3, 8, 2, 3, 9, 5, 1, 2, 3]
    assert prompt_lookup_draft(context, max_ngram=3, num_draft=2) == [8, 2]  # "1 2 3" -> 8
    assert prompt_lookup_draft(context, max_ngram=2, num_draft=2) == [9, 5]  # latest "2 3"
    with pytest.raises(ValueError, match="num_draft"):
        generate_pld(Transformer.from_hf(tiny_llama()), [1, 2], 3, num_draft=0)
