"""ASR scoring: WER and CER per group, pooled over utterances, on normalised text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgestream.bench.asr import Utterance, _scores, write_hypotheses


def _utterances(*pairs: tuple[str, str]) -> list[Utterance]:
    return [Utterance(Path(f"{i}.wav"), text, group) for i, (text, group) in enumerate(pairs)]


def test_cer_counts_a_near_miss_as_a_few_characters_where_wer_counts_a_word() -> None:
    utterances = _utterances(("Why is the sky blue?", "a"), ("It is.", "b"))
    table = _scores(utterances, ["why is the scyve blue", "it is"], [2.0, 1.0], [0.2, 0.1])
    assert table["a"]["wer"] == pytest.approx(1 / 5)
    # "sky" -> "scyve": one substitution and two insertions over 19 reference characters
    assert table["a"]["cer"] == pytest.approx(3 / 19)
    assert table["b"]["wer"] == table["b"]["cer"] == 0
    assert table["overall"]["wer"] == pytest.approx(1 / 7)  # pooled: 1 error in 7 words
    assert table["overall"]["cer"] == pytest.approx(3 / 24)
    assert table["overall"]["rtf"] == pytest.approx(0.1)


def test_hypotheses_file_holds_one_scored_line_per_utterance(tmp_path: Path) -> None:
    utterances = _utterances(("The cat.", "a"), ("A dog", "b"))
    out = tmp_path / "hyps.jsonl"
    write_hypotheses(out, utterances, ["the hat", ""])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["reference"] for line in lines] == ["the cat", "a dog"]
    assert [line["hypothesis"] for line in lines] == ["the hat", ""]
    assert [line["wer"] for line in lines] == [0.5, 1.0]
    assert [line["group"] for line in lines] == ["a", "b"]
