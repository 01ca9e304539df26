"""The word n-gram LM: proper distributions, Kneser-Ney behaviour, ARPA round trips, bad files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgestream.asr import lm as lm_module
from edgestream.asr.lm import BOS, EOS, UNK, NgramLm, load_lm, train_ngram, write_arpa
from edgestream.cli import app

SENTENCES = [
    "i moved to san francisco last year",
    "san francisco is foggy in the summer",
    "we flew to san francisco",
    "san francisco has hills",
    "i lost my reading glasses",
    "she cleaned her glasses",
    "these new glasses are great",
    "the sky is blue",
    "why is the sky blue",
    "the sea is blue today",
    "is the sky grey",
]


def _words(lm: NgramLm) -> list[str]:
    return [w for (w,) in (n for n in lm._probs if len(n) == 1) if w != BOS]


@pytest.mark.parametrize("min_counts", [(1, 1, 1), (1, 1, 2), (1, 2, 2)])
def test_every_context_is_a_distribution_that_sums_to_one(min_counts: tuple[int, ...]) -> None:
    lm = train_ngram(SENTENCES, 3, min_counts)
    words = _words(lm)
    assert UNK in words and EOS in words
    contexts = [(BOS,), (BOS, "san"), ("san", "francisco"), ("the", "sky"), ("is",), ("x", "y")]
    for context in contexts:
        total = sum(math.exp(lm.log_prob(context, w)) for w in words)
        assert total == pytest.approx(1.0, abs=1e-6), context


def test_kneser_ney_backs_off_to_how_many_contexts_a_word_follows() -> None:
    lm = train_ngram(SENTENCES, 3, (1, 1, 1))
    # "francisco" is seen 4 times but only ever after "san"; "glasses" 3 times after 3
    # different words. In a new context, Kneser-Ney prefers the versatile word.
    assert lm.log_prob(("the", "old"), "glasses") > lm.log_prob(("the", "old"), "francisco")
    assert lm.log_prob((BOS, "san"), "francisco") > math.log(0.5)
    assert (
        lm.log_prob(("the",), "zebra") == lm.log_prob(("the",), UNK) < lm.log_prob(("the",), "sky")
    )


@pytest.mark.parametrize("name", ["lm.arpa", "lm.arpa.gz"])
def test_arpa_round_trip_keeps_every_probability(tmp_path: Path, name: str) -> None:
    lm = train_ngram(SENTENCES, 3, (1, 1, 2))
    write_arpa(lm, tmp_path / name)
    again = NgramLm.from_arpa(tmp_path / name)
    assert again.order == 3 and again.size == lm.size
    for context in [(BOS,), (BOS, "why"), ("the", "sky"), ("sky", "is"), ("nope", "never")]:
        for word in [*_words(lm), "unseen"]:
            assert again.log_prob(context, word) == pytest.approx(
                lm.log_prob(context, word), abs=1e-4
            )
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_language_model_files_are_refused_with_their_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.arpa"):
        load_lm(tmp_path / "missing.arpa")
    garbage = tmp_path / "garbage.arpa.gz"
    garbage.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"garbage\.arpa\.gz is not a readable ARPA"):
        load_lm(garbage)
    no_unk = tmp_path / "no-unk.arpa"
    no_unk.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\thello\n\n\\end\\\n")
    with pytest.raises(ValueError, match="<unk>"):
        load_lm(no_unk)
    assert load_lm("none") is None
    with pytest.raises(ValueError, match="no words"):
        train_ngram([], 3)


def test_the_bundled_lm_loads_and_knows_everyday_words() -> None:
    lm = load_lm("default")
    assert lm is not None and lm.order == 3 and lm.size > 100_000
    assert "sky" in lm and lm.log_prob(("the",), "sky") > lm.log_prob(("the",), "sckibe")


def test_cli_builds_an_lm_from_text_and_never_overwrites(tmp_path: Path) -> None:
    runner = CliRunner()
    text = tmp_path / "text.txt"
    text.write_text("The sky is blue. It has 3 clouds!\nWhy is the sky blue?\n", "utf-8")
    out = tmp_path / "lm.arpa.gz"
    built = runner.invoke(app, ["asr", "lm", "--out", str(out), "--text", str(text)])
    assert built.exit_code == 0, built.output
    lm = NgramLm.from_arpa(out)
    assert "three" in lm and "clouds" in lm and "3" not in lm  # normalised like transcripts
    before = out.read_bytes()
    again = runner.invoke(app, ["asr", "lm", "--out", str(out), "--text", str(text)])
    assert again.exit_code == 2 and "exists" in again.stderr and out.read_bytes() == before
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", "utf-8")
    refused = runner.invoke(
        app, ["asr", "lm", "--out", str(tmp_path / "x.arpa"), "--text", str(empty)]
    )
    assert refused.exit_code == 2 and "no sentences" in refused.stderr


def test_the_score_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lm_module, "CACHE_LIMIT", 50)
    lm = train_ngram(SENTENCES, 3)
    first = lm.log_prob((BOS,), "the")
    for n in range(500):  # a long stream asks about ever new contexts
        lm.log_prob((f"w{n}", "is"), "blue")
        assert len(lm._cache) <= 50
    assert lm.log_prob((BOS,), "the") == first
