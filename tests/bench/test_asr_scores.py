"""ASR scoring: WER and CER per group, pooled over utterances, on normalised text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from edgestream.bench.asr import (
    STREAM_UTTERANCES,
    Utterance,
    _scores,
    continuous_streams,
    write_hypotheses,
)


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


def test_continuous_streams_join_each_groups_utterances_in_order_with_pauses(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    utterances = []
    for i, group in enumerate(["a"] * (STREAM_UTTERANCES + 2) + ["b"] * 2):
        path = tmp_path / f"{i}.wav"
        sf.write(path, rng.uniform(-0.5, 0.5, 1_600 + 160 * i), 16_000, subtype="FLOAT")
        utterances.append(Utterance(path, f"word{i}", group))
    folder = tmp_path / "streams"
    folder.mkdir()
    streams, names = continuous_streams(utterances, 0.25, folder)
    assert [s.group for s in streams] == ["a", "a", "b"]
    first = utterances[:STREAM_UTTERANCES]
    assert streams[0].text == " ".join(u.text for u in first)
    assert names[0] == " + ".join(str(u.audio) for u in first)
    samples = sf.read(streams[0].audio, dtype="float32")[0]
    pause = np.zeros(4_000, np.float32)
    parts = [sf.read(u.audio, dtype="float32")[0] for u in first]
    expected = np.concatenate([piece for part in parts for piece in (part, pause)][:-1])
    np.testing.assert_array_equal(samples, expected)
    assert streams[1].text == "word8 word9" and streams[2].text == "word10 word11"
    with pytest.raises(ValueError, match="pause"):
        continuous_streams(utterances, -1.0, folder)
