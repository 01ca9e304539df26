from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgestream.asr.decode import (
    CharVocabulary,
    GreedyDecoder,
    LmFusion,
    PrefixBeamDecoder,
    ctc_greedy,
    ctc_prefix_beam_search,
    make_vocabulary,
    vocabulary_from_metadata,
)
from edgestream.asr.lm import train_ngram


def _log_probs(seed: int, frames: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.log(rng.dirichlet(np.full(vocab, 0.4), size=frames) + 1e-12)


def _ctc_log_likelihood(labels: tuple[int, ...], log_probs: np.ndarray) -> float:
    """log P(labels | log_probs) by the CTC forward algorithm, the textbook way."""
    extended = [0]
    for label in labels:
        extended += [label, 0]
    alpha = np.full(len(extended), -np.inf)
    alpha[0] = log_probs[0, 0]
    if len(extended) > 1:
        alpha[1] = log_probs[0, extended[1]]
    for frame in log_probs[1:]:
        previous = alpha.copy()
        for s, token in enumerate(extended):
            terms = [previous[s]] + ([previous[s - 1]] if s > 0 else [])
            if s > 1 and token != 0 and token != extended[s - 2]:
                terms.append(previous[s - 2])
            alpha[s] = np.logaddexp.reduce(terms) + frame[token]
    return float(np.logaddexp(alpha[-1], alpha[-2]) if len(extended) > 1 else alpha[-1])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_wide_prefix_beam_search_finds_the_most_likely_labelling(seed: int) -> None:
    log_probs = _log_probs(seed, frames=5, vocab=3)
    candidates = [c for n in range(6) for c in itertools.product((1, 2), repeat=n)]
    best = max(candidates, key=lambda c: _ctc_log_likelihood(c, log_probs))
    found = ctc_prefix_beam_search(log_probs, beam=100, token_beam=3, token_threshold=math.inf)
    assert tuple(found) == best


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(1, 7), min_size=1, max_size=6))
def test_decoders_give_the_same_result_whatever_the_pieces(seed: int, cuts: list[int]) -> None:
    log_probs = _log_probs(seed, frames=30, vocab=5)
    greedy, beam = GreedyDecoder(), PrefixBeamDecoder(4, 4)
    start = 0
    for cut in itertools.cycle(cuts):
        if start >= len(log_probs):
            break
        greedy.advance(log_probs[start : start + cut])
        beam.advance(log_probs[start : start + cut])
        start += cut
    assert greedy.ids == ctc_greedy(log_probs)
    assert beam.ids == ctc_prefix_beam_search(log_probs, 4, 4)


def test_greedy_merges_repeats_but_not_across_a_blank() -> None:
    frames = [1, 1, 0, 1, 2, 2, 0, 0, 3]
    log_probs = np.log(np.eye(4)[frames] * 0.97 + 0.01)
    assert ctc_greedy(log_probs) == [1, 1, 2, 3]


def test_vocabulary_round_trip_and_unknown_characters() -> None:
    vocabulary = CharVocabulary()
    assert len(vocabulary) == 29
    text = "it's a test"
    assert vocabulary.decode(vocabulary.encode(text)) == text
    with pytest.raises(ValueError, match="characters"):
        vocabulary.encode("Hello!")


def test_bpe_vocabulary_round_trips_and_survives_its_metadata() -> None:
    texts = [f"the {w} sat on the mat number {n}" for w in ("cat", "dog") for n in ("one", "two")]
    vocabulary = make_vocabulary("bpe-30", texts * 20)
    assert len(vocabulary) == 31 and not vocabulary.is_word_end(1)
    ids = vocabulary.encode("the dog sat on the mat")
    assert min(ids) >= 1 and len(ids) < len("the dog sat on the mat")
    again = vocabulary_from_metadata(vocabulary.to_metadata())
    assert again.decode(ids) == vocabulary.decode(ids) == "the dog sat on the mat"
    with pytest.raises(ValueError, match="unknown vocabulary"):
        make_vocabulary("wordpiece", texts)


LM_TEXT = ["why is the sky blue", "the sky is blue", "is the sea blue", "the sky at night"] * 3


def _spelling(pairs: list[tuple[str, str]], confidence: float = 0.55) -> np.ndarray:
    """One frame per (heard, meant) character pair, each followed by a blank frame: the model
    hears `heard` with `confidence` and `meant` with the rest."""
    vocabulary, rows = CharVocabulary(), []
    for heard, meant in pairs:
        row = np.full(len(vocabulary), 1e-4)
        row[vocabulary.encode(heard)[0]] += confidence
        row[vocabulary.encode(meant)[0]] += 1 - confidence
        rows += [row / row.sum(), np.eye(len(vocabulary))[0] * 0.99 + 0.01 / len(vocabulary)]
    return np.log(np.array(rows))


def test_lm_fusion_turns_what_was_heard_into_the_words_it_knows() -> None:
    vocabulary = CharVocabulary()
    heard, meant = "why is the scki blue", "why is the sky  blue"
    log_probs = _spelling(list(zip(heard, meant, strict=True)))
    plain = vocabulary.decode(ctc_prefix_beam_search(log_probs, 16, 8))
    assert plain == heard
    fusion = LmFusion(train_ngram(LM_TEXT, 3, (1, 1, 1)), vocabulary, 0.5, 2.0, -1.5)
    assert (
        vocabulary.decode(ctc_prefix_beam_search(log_probs, 16, 8, fusion)) == "why is the sky blue"
    )


def test_lm_fusion_reads_words_out_of_bpe_pieces() -> None:
    vocabulary = make_vocabulary("bpe-40", LM_TEXT * 20)
    pieces = {vocabulary.piece_text(i): i for i in range(1, len(vocabulary))}
    heard = [" why", " is", " the", " s", " blue"]
    meant = [" why", " is", " the", " sky", " blue"]
    blank = np.full(len(vocabulary), 1e-4)
    blank[0] = 1.0
    rows = []
    for h, m in zip(heard, meant, strict=True):
        row = np.full(len(vocabulary), 1e-4)
        row[pieces[h]] += 0.55
        row[pieces[m]] += 0.45
        rows += [row / row.sum(), blank / blank.sum()]
    log_probs = np.log(np.array(rows))
    assert vocabulary.decode(ctc_prefix_beam_search(log_probs, 16, 8)) == "why is the s blue"
    fusion = LmFusion(train_ngram(LM_TEXT, 3, (1, 1, 1)), vocabulary, 0.5, 2.0, -1.5)
    fused = ctc_prefix_beam_search(log_probs, 16, 8, fusion)
    assert vocabulary.decode(fused) == "why is the sky blue"


def test_lm_fusion_with_nothing_to_add_is_plain_beam_search() -> None:
    vocabulary = CharVocabulary()
    neutral = LmFusion(train_ngram(LM_TEXT, 3), vocabulary, 0.0, 0.0, 0.0)
    for seed in range(5):
        log_probs = _log_probs(seed, frames=40, vocab=len(vocabulary))
        assert ctc_prefix_beam_search(log_probs, 6, 6, neutral) == ctc_prefix_beam_search(
            log_probs, 6, 6
        )


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_lm_fusion_is_the_same_whatever_the_pieces(seed: int, cuts: list[int]) -> None:
    vocabulary = CharVocabulary()
    fusion = LmFusion(train_ngram(LM_TEXT, 3), vocabulary)
    log_probs = _log_probs(seed, frames=40, vocab=len(vocabulary))
    decoder, start = PrefixBeamDecoder(6, 6, fusion), 0
    for cut in itertools.cycle(cuts):
        if start >= len(log_probs):
            break
        decoder.advance(log_probs[start : start + cut])
        start += cut
    assert decoder.ids == ctc_prefix_beam_search(log_probs, 6, 6, fusion)
