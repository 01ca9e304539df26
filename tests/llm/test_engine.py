"""The autoregressive loop: exact greedy parity with transformers, sampling, stopping, limits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edgestream.llm.engine import Sampling, _top_p_filter, check_request, generate_ar
from edgestream.llm.model import Transformer
from tests.conftest import tiny_llama


@pytest.fixture(scope="module")
def hf_model() -> object:
    return tiny_llama(max_position=64)


@pytest.fixture(scope="module")
def ours(hf_model: object) -> Transformer:
    return Transformer.from_hf(hf_model)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_equals_transformers_generate(
    hf_model: object, ours: Transformer, seed: int
) -> None:
    prompt = torch.randint(3, 300, (1, 5 + 3 * seed), generator=torch.Generator().manual_seed(seed))
    expected = hf_model.generate(
        prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, prompt.shape[1] :].tolist()
    result = generate_ar(ours, prompt[0].tolist(), 20)
    assert result.token_ids == expected
    assert result.forward_passes == 20 and result.mean_accepted == 1.0
    assert result.finish_reason == "length"


def test_stops_at_a_stop_token_and_keeps_it(ours: Transformer) -> None:
    free_run = generate_ar(ours, [5, 6, 7], 12).token_ids
    stop = free_run[4]
    result = generate_ar(ours, [5, 6, 7], 12, stop_ids={stop})
    first = free_run.index(stop)
    assert result.token_ids == free_run[: first + 1]
    assert result.finish_reason == "stop"


def test_stops_at_the_context_end(ours: Transformer) -> None:
    result = generate_ar(ours, list(range(3, 60)), 100)  # context is 64 tokens
    assert result.new_tokens == 64 - 57
    assert result.finish_reason == "context"


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(ours: Transformer) -> None:
    sampling = Sampling(temperature=1.5, top_p=0.95, seed=7)
    first = generate_ar(ours, [5, 6, 7], 24, sampling=sampling).token_ids
    again = generate_ar(ours, [5, 6, 7], 24, sampling=sampling).token_ids
    greedy = generate_ar(ours, [5, 6, 7], 24).token_ids
    assert first == again
    assert first != greedy


def test_tiny_top_p_is_greedy(ours: Transformer) -> None:
    sampling = Sampling(temperature=1.0, top_p=1e-6, seed=0)
    assert (
        generate_ar(ours, [9, 10], 16, sampling=sampling).token_ids
        == generate_ar(ours, [9, 10], 16).token_ids
    )


def test_top_p_filter_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([0.1, 0.5, 0.3, 0.1])
    kept = _top_p_filter(probs, 0.75)
    torch.testing.assert_close(kept, torch.tensor([0.0, 0.625, 0.375, 0.0]))


def test_streaming_callback_sees_every_token(ours: Transformer) -> None:
    seen: list[int] = []
    result = generate_ar(ours, [5, 6], 10, on_token=seen.append)
    assert seen == result.token_ids


@pytest.mark.parametrize(
    ("prompt", "max_new", "match"),
    [([], 5, "prompt is empty"), ([1, 2], 0, "at least 1"), (list(range(64)), 5, "context is 64")],
)
def test_bad_requests_are_refused(prompt: list[int], max_new: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_request(prompt, max_new, 64)


@pytest.mark.parametrize("prompt", [[5, 300], [-1, 5], [2.0, 5], ["5"]])
def test_token_ids_outside_the_vocabulary_are_refused(
    prompt: list[object], tiny_model_dir: Path, tiny_streams: Path
) -> None:
    from edgestream.llm import MethodOptions, load_language_model, make_decoder

    lm = load_language_model(str(tiny_model_dir))  # a vocabulary of 300
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 300\)"):
        check_request(prompt, 5, 64, vocab_size=300)
    options = MethodOptions(streams_path=tiny_streams)
    for method in ("ar", "ss", "pld"):  # each decoder checks before it touches the model
        with pytest.raises(ValueError, match="token ids must be integers"):
            make_decoder(method, lm, options)(prompt, 5)
    assert check_request([0, np.int64(299)], 5, 64, vocab_size=300) == 5  # numpy ints are ids


@pytest.mark.parametrize(("temperature", "top_p"), [(-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)])
def test_bad_sampling_is_refused(temperature: float, top_p: float) -> None:
    with pytest.raises(ValueError):
        Sampling(temperature=temperature, top_p=top_p)
