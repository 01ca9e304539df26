"""Paired comparison of two recognizers' hypotheses: pooled WER and its bootstrap interval."""

from __future__ import annotations

import json
from pathlib import Path

import jiwer
import pytest
from typer.testing import CliRunner

from edgestream.bench.asr import Utterance, write_hypotheses
from edgestream.bench.asr_compare import compare_runs, read_hypotheses
from edgestream.cli import app

REFERENCES = [f"the cat number {i} sat on the mat" for i in range(60)]


def _write(path: Path, hypotheses: list[str]) -> Path:
    """The first len(hypotheses) references, odd ones in group a, even ones in b."""
    utterances = [
        Utterance(Path(f"{i}.wav"), REFERENCES[i], "a" if i % 2 else "b")
        for i in range(len(hypotheses))
    ]
    write_hypotheses(path, utterances, hypotheses)
    return path


def _with_errors(every: int) -> list[str]:
    """One substituted word in every `every`-th utterance."""
    return [r.replace("cat", "hat") if i % every == 0 else r for i, r in enumerate(REFERENCES)]


def test_pooled_wer_of_each_run_is_jiwers_over_all_utterances(tmp_path: Path) -> None:
    before = _with_errors(2)
    before[3] = "the cat"  # five deletions: long and short errors pool by words, not by line
    after = _with_errors(5)
    report = compare_runs(
        read_hypotheses(_write(tmp_path / "b.jsonl", before)),
        read_hypotheses(_write(tmp_path / "a.jsonl", after)),
        rounds=500,
    )
    assert report["overall"]["wer_before"] == pytest.approx(
        100 * jiwer.wer(REFERENCES, before), abs=0.005
    )
    assert report["overall"]["wer_after"] == pytest.approx(
        100 * jiwer.wer(REFERENCES, after), abs=0.005
    )
    odd = list(range(1, 60, 2))
    assert report["groups"]["a"]["wer_after"] == pytest.approx(
        100 * jiwer.wer([REFERENCES[i] for i in odd], [after[i] for i in odd]), abs=0.005
    )
    assert report["overall"]["utterances"] == 60


def test_identical_runs_differ_by_nothing_and_a_clear_gain_excludes_zero(tmp_path: Path) -> None:
    worse = read_hypotheses(_write(tmp_path / "w.jsonl", _with_errors(1)))
    better = read_hypotheses(_write(tmp_path / "g.jsonl", _with_errors(10)))
    same = compare_runs(worse, worse, rounds=500)["overall"]
    assert (same["difference"], same["low"], same["high"]) == (0, 0, 0)
    gain = compare_runs(worse, better, rounds=500)["overall"]
    assert gain["low"] <= gain["difference"] <= gain["high"] < 0
    assert (gain["better"], gain["worse"]) == (54, 0)
    # Swapping the runs mirrors the difference
    assert compare_runs(better, worse, rounds=500)["overall"]["difference"] == -gain["difference"]


def test_a_small_difference_on_few_utterances_straddles_zero(tmp_path: Path) -> None:
    before = _with_errors(6)
    after = list(before)
    after[0] = REFERENCES[0]  # one error fewer, two more elsewhere
    after[1] = after[1].replace("mat", "hat")
    after[7] = after[7].replace("sat", "set")
    report = compare_runs(
        read_hypotheses(_write(tmp_path / "b.jsonl", before)),
        read_hypotheses(_write(tmp_path / "a.jsonl", after)),
        rounds=2000,
    )["overall"]
    assert report["difference"] > 0 and report["low"] < 0 < report["high"]


def test_runs_on_different_utterances_or_bad_files_are_refused(tmp_path: Path) -> None:
    full = read_hypotheses(_write(tmp_path / "full.jsonl", REFERENCES))
    part = read_hypotheses(_write(tmp_path / "part.jsonl", REFERENCES[:10]))
    with pytest.raises(ValueError, match="different utterances"):
        compare_runs(full, part)
    (tmp_path / "bad.jsonl").write_text('{"audio": "x.wav"}\n')
    with pytest.raises(ValueError, match="line 1"):
        read_hypotheses(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="hypotheses"):
        read_hypotheses(tmp_path / "none.jsonl")


def test_cli_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    before = _write(tmp_path / "b.jsonl", _with_errors(1))
    after = _write(tmp_path / "a.jsonl", _with_errors(3))
    out = tmp_path / "cmp.json"
    result = CliRunner().invoke(
        app,
        ["bench", "asr-compare", str(before), str(after), "--rounds", "500", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "overall" in result.stdout
    report = json.loads(out.read_text())
    assert set(report["groups"]) == {"a", "b"} and report["overall"]["difference"] < 0
    missing = CliRunner().invoke(app, ["bench", "asr-compare", str(before), str(tmp_path / "no")])
    assert missing.exit_code == 2 and "hypotheses" in missing.stderr
