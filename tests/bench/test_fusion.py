"""The fusion grid scores a setting exactly as the streaming recogniser decodes with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jiwer
import pytest

from edgestream.asr.lm import load_lm
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import StreamingOptions
from edgestream.bench.asr import (
    REAL_SPEECH_MANIFEST,
    Utterance,
    normalize_text,
    read_bench_manifest,
    run_edgestream,
)
from edgestream.bench.fusion import FusionSetting, fusion_grid


@pytest.fixture(scope="module")
def commands() -> list[Utterance]:
    # Short single-phrase recordings: no endpoint splits them, so one beam search per file is
    # what the recogniser runs too.
    return [u for u in read_bench_manifest(REAL_SPEECH_MANIFEST) if u.group == "cmu-commands"][:4]


@pytest.mark.parametrize("setting", [FusionSetting(0.7, 2.0, -1.5), FusionSetting(0.2, 0.5, -3.0)])
def test_a_settings_wer_is_the_streaming_recognisers(
    commands: list[Utterance], setting: FusionSetting
) -> None:
    lm = load_lm("default")
    options = StreamingOptions(
        beam=8,
        lm=lm,
        lm_weight=setting.weight,
        word_bonus=setting.word_bonus,
        unknown_penalty=setting.unknown_penalty,
    )
    hypotheses, _, _ = run_edgestream("default", "torch", commands, options, 1)
    references = [normalize_text(u.text) for u in commands]
    streamed = jiwer.wer(references, [normalize_text(h) for h in hypotheses])
    [score] = fusion_grid(load_model("default"), commands, lm, [setting], beam=8)
    assert score.wer == pytest.approx(streamed)
    assert score.wer_even == pytest.approx(jiwer.wer(references[0::2], hypotheses[0::2]))
    assert score.wer_odd == pytest.approx(jiwer.wer(references[1::2], hypotheses[1::2]))


def test_worker_processes_score_as_one_process_does(commands: list[Utterance]) -> None:
    lm, asr = load_lm("default"), load_model("default")
    settings = [FusionSetting(0.5, 1.0, -1.5), FusionSetting(0.9, 3.0, -1.5)]
    alone = fusion_grid(asr, commands, lm, settings, beam=4)
    assert fusion_grid(asr, commands, lm, settings, beam=4, jobs=2) == alone
    assert [s.setting for s in alone] == settings


def test_a_missing_manifest_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgestream.bench.fusion", "--manifest", str(tmp_path / "no")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no" in result.stderr
