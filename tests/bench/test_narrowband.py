"""The narrow-band probe: 8 kHz copies of a manifest's audio, texts and groups kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from edgestream.asr.audio import read_audio
from edgestream.asr.features import compute_fbank
from edgestream.asr.manifest import read_manifest
from edgestream.bench.asr import REAL_SPEECH_MANIFEST
from edgestream.bench.narrowband import write_narrowband


def test_copies_are_8khz_files_of_the_same_speech_and_resume(tmp_path: Path) -> None:
    source = read_manifest(REAL_SPEECH_MANIFEST)
    target = write_narrowband(REAL_SPEECH_MANIFEST, tmp_path / "nb", limit=3)
    entries = read_manifest(target)
    assert len(entries) == 3
    for entry in entries:
        info = sf.info(target.parent / entry.audio)
        assert (info.samplerate, info.channels) == (8_000, 1)
        original = next(s for s in source if s.text == entry.text)
        assert entry.group == original.group
        assert entry.duration == pytest.approx(original.duration, abs=0.01)
    first = target.parent / entries[0].audio
    stamp = first.stat().st_mtime_ns
    write_narrowband(REAL_SPEECH_MANIFEST, tmp_path / "nb", limit=3)
    assert first.stat().st_mtime_ns == stamp  # kept, not rewritten


def test_nothing_above_4khz_survives_the_round_trip(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    noise = (np.random.default_rng(0).standard_normal(16_000) * 0.1).astype(np.float32)
    sf.write(tmp_path / "noise.wav", noise, 16_000)
    manifest.write_text('{"audio": "noise.wav", "text": "noise"}\n')
    target = write_narrowband(manifest, tmp_path / "nb")
    heard = compute_fbank(read_audio(target.parent / "00000.wav")).mean(axis=0)
    full = compute_fbank(noise).mean(axis=0)
    assert np.abs(heard[:50] - full[:50]).max() < 0.3  # below 3 kHz: unchanged
    assert (full[65:] - heard[65:]).min() > 10  # above 4.8 kHz: gone


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sample rate"):
        write_narrowband(REAL_SPEECH_MANIFEST, tmp_path / "nb", rate=100)
    command = [sys.executable, "-m", "edgestream.bench.narrowband", "--manifest", "missing.jsonl"]
    run = subprocess.run(
        [*command, "--out", str(tmp_path / "nb")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("error:") and "missing.jsonl" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
