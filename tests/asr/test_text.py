"""Sentence extraction: number spelling, normalisation to the vocabulary, split rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgestream.asr.text import (
    VOCAB,
    lm_sentences,
    load_splits,
    normalize_sentence,
    resolve_data_dir,
    spell_number,
    spell_ordinal,
    spell_year,
    split_of,
    split_sentences,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("EDGESTREAM_DATA", ROOT.parent / "shared" / "data"))
needs_data = pytest.mark.skipif(
    not (DATA / "llm").is_dir(), reason=f"shared data not found at {DATA} (set EDGESTREAM_DATA)"
)


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (20, "twenty"),
        (42, "forty two"),
        (100, "one hundred"),
        (101, "one hundred one"),
        (999, "nine hundred ninety nine"),
        (1205, "one thousand two hundred five"),
        (1_000_000, "one million"),
        (2_000_000_001, "two billion one"),
        (-5, "minus five"),
    ],
)
def test_spell_number(n: int, words: str) -> None:
    assert spell_number(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (5, "fifth"),
        (12, "twelfth"),
        (20, "twentieth"),
        (22, "twenty second"),
        (99, "ninety ninth"),
        (100, "one hundredth"),
    ],
)
def test_spell_ordinal(n: int, words: str) -> None:
    assert spell_ordinal(n) == words


@pytest.mark.parametrize(
    ("year", "words"),
    [
        (1066, "ten sixty six"),
        (1900, "nineteen hundred"),
        (1905, "nineteen oh five"),
        (1996, "nineteen ninety six"),
        (2000, "two thousand"),
        (2005, "two thousand five"),
        (2015, "twenty fifteen"),
    ],
)
def test_spell_year(year: int, words: str) -> None:
    assert spell_year(year) == words


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Weng earns $12 an hour.", "weng earns twelve dollars an hour"),
        ("It costs $12.50 in total.", "it costs twelve dollars and fifty cents in total"),
        (
            "Ski resorts brought £37.5m in.",
            "ski resorts brought thirty seven point five million pounds in",
        ),
        ("Sales rose 25% last year.", "sales rose twenty five percent last year"),
        ("We met on the 22nd of May.", "we met on the twenty second of may"),
        ("The train leaves at 3:05 pm today.", "the train leaves at three oh five p m today"),
        ("She ate 3/4 of the cake.", "she ate three quarters of the cake"),
        (
            "About 1,234 people came in 1996.",
            "about one thousand two hundred thirty four people came in nineteen ninety six",
        ),
        ("Mr. Smith's café is family-friendly.", "mister smith's cafe is family friendly"),
        ("I ' Ve been having trouble , don ' t worry.", "i've been having trouble don't worry"),
        ("He said 'hello' to them.", "he said hello to them"),
    ],
)
def test_normalize_sentence(raw: str, expected: str) -> None:
    assert normalize_sentence(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "The NFL champion won.",  # acronym: letters or a word?
        "Natalia sold 48/2 = 24 clips.",  # formula
        "Hello there.",  # two words
        " ".join(["word"] * 26),  # too long
        "Он говорит по-русски сейчас.",  # letters outside a-z
        "SELECT name FROM singer;",  # code
    ],
)
def test_unspeakable_sentences_are_dropped(raw: str) -> None:
    assert normalize_sentence(raw) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.text(" abcdeXY0123456789$£%:/.,'-&", max_size=120)))
def test_normalized_text_uses_only_the_vocabulary(raw: str) -> None:
    sentence = normalize_sentence(raw)
    if sentence is not None:
        assert set(sentence) <= set(VOCAB)
        assert sentence == " ".join(sentence.split())  # single spaces, no padding
        assert 3 <= len(sentence.split()) <= 25


def test_split_sentences_keeps_titles_together() -> None:
    text = 'Hello Mr. Smith. How are you? I am 5. "Great!" She said.\nA new line'
    assert split_sentences(text) == [
        "Hello Mister Smith.",
        "How are you?",
        "I am 5.",
        '"Great!',
        "She said.",
        "A new line",
    ]


def test_split_rule_is_a_function_of_the_text_with_the_right_proportions() -> None:
    sentences = [f"sentence number {spell_number(i)}" for i in range(20_000)]
    splits = [split_of(s) for s in sentences]
    assert splits == [split_of(s) for s in sentences]
    assert splits.count("test") / len(splits) == pytest.approx(0.05, abs=0.01)
    assert splits.count("dev") / len(splits) == pytest.approx(0.03, abs=0.01)
    with pytest.raises(ValueError, match="summing below 1"):
        split_of("a b c", dev_fraction=0.5, test_fraction=0.5)


def test_missing_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="llm/ subfolder"):
        resolve_data_dir(tmp_path / "nowhere")


@needs_data
def test_real_sentences_are_clean_distinct_and_split_disjointly() -> None:
    splits = load_splits(DATA, sources=("spider", "dialogsum"))
    train, dev, test = set(splits.train), set(splits.dev), set(splits.test)
    assert len(train) == len(splits.train) and len(test) == len(splits.test)  # deduplicated
    assert not train & test and not train & dev and not dev & test
    assert len(test) > 200 and len(train) > 10 * len(test)
    for sentence in train | dev | test:
        assert set(sentence) <= set(VOCAB) and 3 <= len(sentence.split()) <= 25
        assert split_of(sentence) in ("train", "dev", "test")
    assert all(split_of(s) == "test" for s in test)


@needs_data
def test_lm_sentences_widen_the_train_split_and_never_hold_dev_or_test() -> None:
    sources = ("spider", "dialogsum")
    splits, wide = load_splits(DATA, sources=sources), lm_sentences(DATA, sources=sources)
    assert set(splits.train) < set(wide)
    assert not set(wide) & (set(splits.dev) | set(splits.test))
    lengths = [len(s.split()) for s in wide]
    assert min(lengths) < 3 and max(lengths) > 25  # the lengths synth leaves out are in
