"""Core ML export: the converted step's PyTorch twin equals the ONNX one; the conversion runs
here (coremltools on Linux); prediction needs macOS and runs only there."""

from __future__ import annotations

import importlib.util
import json
import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgestream.asr.backends import load_streaming_model
from edgestream.asr.conformer import rope_tables
from edgestream.asr.coreml import (
    COREML_FORMAT,
    INPUTS,
    OUTPUTS,
    export_coreml,
    host_rope_tables,
    load_coreml_model,
)
from edgestream.asr.decode import vocabulary_from_metadata
from edgestream.asr.export import HostRopeStep, StreamingStep
from edgestream.asr.features import load_audio
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import Recognizer, StreamingOptions
from edgestream.cli import app

OPTIONS = StreamingOptions(chunk_ms=160, left_chunks=2)
needs_coremltools = pytest.mark.skipif(
    importlib.util.find_spec("coremltools") is None,
    reason="coremltools is not installed (pip install coremltools)",
)


@pytest.mark.parametrize("first", [0, 17, 90_000])
def test_host_rope_tables_equal_the_model_s(first: int) -> None:
    cos, sin = host_rope_tables(36, first, 16, 10_000.0)
    expected_cos, expected_sin = rope_tables(36, first + torch.arange(16), 10_000.0)
    np.testing.assert_array_equal(cos, expected_cos.numpy())
    np.testing.assert_array_equal(sin, expected_sin.numpy())


def test_the_step_with_rope_inputs_equals_the_onnx_step(random_model: Path) -> None:
    """What Core ML converts is `HostRopeStep`: over a stream of chunks it must give exactly
    what the ONNX export's step gives."""
    model = load_model(random_model).model.eval()
    cached = OPTIONS.left_chunks * OPTIONS.chunk_frames
    onnx_step, coreml_step = StreamingStep(model, cached), HostRopeStep(model, cached)
    _, _, keys, values, conv, _ = onnx_step.example_inputs(OPTIONS.chunk_frames)
    onnx_caches = coreml_caches = (keys, values, conv)
    generator, offset = torch.Generator().manual_seed(0), 0
    for frames in (4, 4, 4, 2):
        window = torch.randn(1, 4 * (frames - 1) + 7, 80, generator=generator)
        valid = torch.tensor([min(offset, cached)])
        with torch.no_grad():
            expected = onnx_step(window, torch.tensor([offset]), *onnx_caches, valid)
            cos, sin = (torch.from_numpy(t) for t in host_rope_tables(
                model.config.d_model // model.config.num_heads, offset, frames,
                model.config.rope_base))  # fmt: skip
            got = coreml_step(window, cos, sin, *coreml_caches, valid)
        for a, b in zip(expected, got, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        onnx_caches, coreml_caches, offset = expected[1:], got[1:], offset + frames


@needs_coremltools
def test_conversion_writes_a_package_with_the_streaming_interface(
    random_model: Path, tmp_path: Path
) -> None:
    import coremltools as ct

    asr = load_model(random_model)
    for precision in ("float32", "float16"):
        path = export_coreml(asr, tmp_path, OPTIONS, precision)
        assert path.suffix == ".mlpackage" and path.is_dir()
        spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
        assert [i.name for i in spec.description.input] == list(INPUTS)
        assert [o.name for o in spec.description.output] == list(OUTPUTS)
        meta = dict(spec.description.metadata.userDefined)
        assert meta["format"] == COREML_FORMAT and meta["precision"] == precision
        assert int(meta["cached"]) == 8 and json.loads(meta["config"])["d_model"] == 32
        assert vocabulary_from_metadata(meta).decode([1, 2]) == "ab"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "conformer-ctc.float16.mlpackage",
        "conformer-ctc.mlpackage",
    ]


@needs_coremltools
def test_cli_exports_core_ml_and_says_where_it_runs(random_model: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["export", "asr", "--model", str(random_model), "--out", str(tmp_path), "--format"]
    done = runner.invoke(app, [*args, "coreml", "--chunk-ms", "160", "--left-chunks", "2"])
    assert done.exit_code == 0, done.output
    package = tmp_path / "conformer-ctc.mlpackage"
    assert str(package) in done.stdout and "needs macOS" in done.stdout
    refused = runner.invoke(app, [*args, "coreml", "--int8"])
    assert refused.exit_code == 2 and "--int8 is for ONNX" in refused.stderr
    if platform.system() != "Darwin":
        with pytest.raises(ValueError, match="needs macOS"):
            load_streaming_model(str(package))
    with pytest.raises(ValueError, match=r"--backend coreml runs an exported \.mlpackage"):
        load_streaming_model(str(random_model), "coreml")


@needs_coremltools
@pytest.mark.skipif(platform.system() != "Darwin", reason="Core ML prediction needs macOS")
def test_core_ml_streams_like_pytorch(
    random_model: Path, tiny_corpus: Path, tmp_path: Path
) -> None:  # pragma: no cover - runs on macOS only
    asr = load_model(random_model)
    coreml = load_coreml_model(export_coreml(asr, tmp_path, OPTIONS))
    for entry in read_manifest(tiny_corpus / "dev.jsonl")[:2]:
        samples = load_audio(tiny_corpus / entry.audio)
        texts = []
        for model in (asr, coreml):
            recognizer = Recognizer(model, OPTIONS)
            recognizer.accept_waveform(samples)
            texts.append(recognizer.finalize())
        assert texts[0] == texts[1] != ""
