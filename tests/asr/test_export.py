"""ONNX export of the streaming step: onnxruntime streams exactly as PyTorch does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgestream.asr.backends import load_streaming_model
from edgestream.asr.export import export_onnx, max_step_difference
from edgestream.asr.features import load_audio
from edgestream.asr.lm import load_lm
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.onnx_runtime import load_onnx_model
from edgestream.asr.streaming import Recognizer, StreamingOptions
from edgestream.cli import app

runner = CliRunner()
OPTIONS = StreamingOptions(chunk_ms=160, left_chunks=2)


@pytest.fixture(scope="module")
def exported(random_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("onnx")
    return export_onnx(load_model(random_model), out, OPTIONS, ("float32", "float16", "int8"))


def _stream(asr: object, samples: np.ndarray, options: StreamingOptions) -> Recognizer:
    recognizer = Recognizer(asr, options)
    for start in range(0, len(samples), 1234):  # pieces that do not line up with chunks
        recognizer.accept_waveform(samples[start : start + 1234])
    recognizer.finalize()
    return recognizer


def test_onnx_streaming_equals_pytorch_streaming(
    random_model: Path, exported: dict[str, Path], tiny_corpus: Path
) -> None:
    """A random model emits arbitrary characters nearly every frame: a strict comparison."""
    torch_model, onnx_model = load_model(random_model), load_onnx_model(exported["float32"])
    entries = read_manifest(tiny_corpus / "train.jsonl")[:4]
    for entry in entries:
        samples = load_audio(tiny_corpus / entry.audio)
        expected = _stream(torch_model, samples, OPTIONS).text
        assert len(expected) > 10
        assert _stream(onnx_model, samples, OPTIONS).text == expected
    assert max_step_difference(torch_model, exported["float32"], OPTIONS) < 1e-4


def test_float16_and_int8_exports_are_smaller_and_close(
    random_model: Path, exported: dict[str, Path]
) -> None:
    sizes = {precision: path.stat().st_size for precision, path in exported.items()}
    # (the tiny test model is mostly graph, not weights: the bundled one shrinks 1.9x and 3.3x)
    assert sizes["float16"] < 0.8 * sizes["float32"] and sizes["int8"] < sizes["float32"]
    asr = load_model(random_model)
    assert max_step_difference(asr, exported["float16"], OPTIONS) < 0.05
    assert max_step_difference(asr, exported["int8"], OPTIONS) < 1.0
    for path in exported.values():
        assert load_onnx_model(path).cached == OPTIONS.left_chunks * OPTIONS.chunk_frames


def test_an_export_runs_only_with_its_own_chunk_settings(exported: dict[str, Path]) -> None:
    model = load_onnx_model(exported["float32"])
    with pytest.raises(ValueError, match="exported for --chunk-ms 160 --left-chunks 2"):
        Recognizer(model, StreamingOptions(chunk_ms=640, left_chunks=4))


def test_backend_choice_and_bad_models(exported: dict[str, Path], tmp_path: Path) -> None:
    assert type(load_streaming_model(str(exported["float32"]))).__name__ == "OnnxAsrModel"
    assert type(load_streaming_model("default", "torch")).__name__ == "AsrModel"
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        load_streaming_model("default", "tpu")
    with pytest.raises(ValueError, match="--backend onnx runs an exported"):
        load_streaming_model("default", "onnx")
    with pytest.raises(ValueError, match="use --backend onnx"):
        load_streaming_model(str(exported["float32"]), "torch")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a graph")
    with pytest.raises(ValueError, match="not a loadable ONNX model"):
        load_onnx_model(garbage)
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        load_onnx_model(tmp_path / "missing.onnx")


def test_cli_exports_then_transcribes_with_onnxruntime(
    random_model: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    result = runner.invoke(
        app, ["export", "asr", "--model", str(random_model), "--out", str(out), "--int8"]
    )
    assert result.exit_code == 0, result.output
    assert "max |log-prob - PyTorch|" in result.stdout
    onnx_file = out / "conformer-ctc.onnx"
    assert onnx_file.is_file() and (out / "conformer-ctc.int8.onnx").is_file()
    audio = str(tiny_corpus / read_manifest(tiny_corpus / "test.jsonl")[0].audio)
    texts = {}
    for model, backend in ((str(random_model), "torch"), (str(onnx_file), "onnx")):
        run = runner.invoke(
            app, ["transcribe", audio, "--model", model, "--backend", backend, "--json"]
        )
        assert run.exit_code == 0, run.output
        texts[backend] = json.loads(run.stdout)["text"]
    assert texts["onnx"] == texts["torch"] != ""
    mismatch = runner.invoke(
        app, ["transcribe", audio, "--model", str(onnx_file), "--chunk-ms", "320"]
    )
    assert mismatch.exit_code == 2 and "exported for --chunk-ms 640" in mismatch.stderr
    refused = runner.invoke(app, ["export", "asr", "--out", str(out), "--format", "tflite"])
    assert refused.exit_code == 2 and "unknown format 'tflite'" in refused.stderr


def test_the_onnx_path_never_imports_pytorch(
    random_model: Path, exported: dict[str, Path], tiny_corpus: Path
) -> None:
    """What an edge device without PyTorch runs: read audio, features, onnxruntime, the
    beam search with the bundled word LM, and the CLI around them."""
    audio = tiny_corpus / read_manifest(tiny_corpus / "test.jsonl")[0].audio
    argv = ["edgestream", "transcribe", str(audio), "--model", str(exported["float32"])]
    argv += ["--chunk-ms", "160", "--left-chunks", "2", "--threads", "1", "--json"]
    code = (
        "import sys\n"
        "from edgestream.cli import main\n"
        "import edgestream.bench.asr\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "assert 'torch' not in sys.modules, 'PyTorch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    options = StreamingOptions(chunk_ms=160, left_chunks=2, beam=16, lm=load_lm("default"))
    expected = _stream(load_model(random_model), load_audio(audio), options).text
    assert json.loads(done.stdout)["text"] == expected
