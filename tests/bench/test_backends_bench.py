"""`bench backends`: every backend runs in its own process on the same manifest."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from edgestream.cli import app
from tests.asr.conftest import random_model, tiny_corpus  # noqa: F401 (fixtures)


def test_every_backend_reports_wer_speed_and_memory(
    random_model: Path,  # noqa: F811
    tiny_corpus: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "backends.json"
    arguments = ["bench", "backends", "--manifest", str(tiny_corpus / "test.jsonl")]
    arguments += ["--model", str(random_model), "--limit", "2", "--chunk-ms", "160"]
    result = CliRunner().invoke(app, [*arguments, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = report["backends"]
    assert list(rows) == ["torch", "accelerator", "onnx-float32", "onnx-float16", "onnx-int8"]
    for row in rows.values():
        assert row["utterances"] == 2 and row["rtf"] > 0 and row["rtf_2threads"] > 0
        assert 50 < row["peak_mib"] < 4096  # a whole process: interpreter, libraries, model
    # The same weights, the same arithmetic up to rounding: the same words.
    assert rows["accelerator"]["wer"] == rows["onnx-float32"]["wer"] == rows["torch"]["wer"]
    assert rows["torch"]["wer_vs_torch"] == 0


def test_unknown_backends_are_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("")
    result = CliRunner().invoke(
        app, ["bench", "backends", "--manifest", str(manifest), "--backends", "torch,tpu"]
    )
    assert result.exit_code == 2 and "unknown backend ['tpu']" in result.stderr
