"""The other-synthesisers probe: real Flite and Festival voices where the system has them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from edgestream.bench.other_voices import Voice, write_probe

SENTENCES = ("turn left at the bridge", "a quiet morning by the lake", "open the window please")


def _manifest(folder: Path) -> Path:
    path = folder / "sentences.jsonl"
    path.write_text("".join(json.dumps({"audio": "x.wav", "text": t}) + "\n" for t in SENTENCES))
    return path


@pytest.mark.parametrize(
    ("voice", "command"),
    [
        (Voice("flite", "slt"), "flite"),
        (Voice("festival", "ked_diphone"), "text2wave"),
    ],
)
def test_probe_speaks_each_sentence_and_resumes(tmp_path: Path, voice: Voice, command: str) -> None:
    if shutil.which(command) is None:
        pytest.skip(f"{command} missing (Debian/Ubuntu: apt install flite festival)")
    out = tmp_path / "probe"
    target = write_probe(_manifest(tmp_path), out, limit=2, voices=[voice])
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["text"] for r in rows] == list(SENTENCES[:2])
    for row in rows:
        info = sf.info(out / row["audio"])
        assert row["group"] == voice.group and info.channels == 1
        assert row["duration"] == pytest.approx(info.duration, abs=1e-3) and row["duration"] > 0.8
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*.wav")}
    write_probe(_manifest(tmp_path), out, limit=2, voices=[voice])  # existing audio is kept
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.wav")} == stamps


def test_probe_refuses_a_missing_manifest_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgestream.bench.other_voices",
            "--manifest",
            str(tmp_path / "none.jsonl"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in proc.stderr
