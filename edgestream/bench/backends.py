"""Every way edgestream can run the recognizer, on the same manifest: WER, RTF and peak memory.

Backends: PyTorch eager float32, the accelerator-layout graph in float32 (`accelerator.py`),
and onnxruntime on the exported streaming step in float32, float16 and int8. Each runs as its
own `edgestream bench asr` process, which reports its own peak resident memory (VmHWM):
interpreter, libraries, model and streaming state together, as a deployment would pay.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from edgestream.asr.export import export_onnx
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import StreamingOptions

BACKENDS = ("torch", "accelerator", "onnx-float32", "onnx-float16", "onnx-int8")


def _run_bench_asr(arguments: list[str]) -> dict[str, object]:
    """One `edgestream bench asr` process -> its report (with its own peak memory)."""
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "edgestream", "bench", "asr", *arguments]
        done = subprocess.run(
            [*command, "--no-pocketsphinx", "--json", str(report_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        return json.loads(report_path.read_text())


def bench_backends(
    manifest: Path,
    model: str = "default",
    options: StreamingOptions = StreamingOptions(),
    limit: int | None = None,
    backends: tuple[str, ...] = BACKENDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """{"model", "manifest", "chunk_ms", "backends": {name: {"wer", "rtf", "rtf_2threads",
    "peak_mib", "wer_vs_torch"}}}; ONNX models are exported to a temporary folder first."""
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"unknown backend {sorted(unknown)}: expected some of {BACKENDS}")
    common = ["--manifest", str(manifest), "--chunk-ms", str(options.chunk_ms)]
    common += ["--left-chunks", str(options.left_chunks)]
    if limit is not None:
        common += ["--limit", str(limit)]
    rows: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        precisions = tuple(b.removeprefix("onnx-") for b in backends if b.startswith("onnx-"))
        exported = {}
        if precisions:
            if progress is not None:
                progress("exporting to ONNX")
            exported = export_onnx(load_model(model), Path(scratch), options, precisions)
        for backend in backends:
            if progress is not None:
                progress(backend)
            if backend.startswith("onnx-"):
                target = ["--model", str(exported[backend.removeprefix("onnx-")])]
                target += ["--backend", "onnx"]
            else:
                target = ["--model", model, "--backend", backend]
            report = _run_bench_asr([*common, *target])
            overall = report["overall"]
            rows[backend] = {
                "wer": overall["wer"],
                "rtf": overall["rtf"],
                "rtf_2threads": overall["rtf_2threads"],
                "peak_mib": report["peak_rss_mib"],
                "utterances": overall["utterances"],
            }
    if "torch" in rows:
        for row in rows.values():
            row["wer_vs_torch"] = round(row["wer"] - rows["torch"]["wer"], 4)
    return {
        "model": model,
        "manifest": str(manifest),
        "chunk_ms": options.chunk_ms,
        "left_chunks": options.left_chunks,
        "backends": rows,
    }
