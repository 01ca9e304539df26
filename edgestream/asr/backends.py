"""Choosing what runs the streaming step: PyTorch, the accelerator-layout graph, or onnxruntime.

This module imports no PyTorch: the onnxruntime path (features, decoding and endpoints in
numpy, the encoder step in onnxruntime) runs on a machine without it, and each backend's
modules are imported only when that backend is asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgestream.asr.streaming import StreamingModel

BACKENDS = ("auto", "torch", "accelerator", "onnx", "coreml")
SUFFIXES = {".onnx": "onnx", ".mlpackage": "coreml"}  # exported files and what runs them


def exported_fields(meta: dict[str, str], path: Path) -> dict[str, object]:
    """What every exported step carries in its metadata besides the graph: CMVN, vocabulary
    and the chunk settings its cache size was built for."""
    from edgestream.asr.decode import vocabulary_from_metadata
    from edgestream.asr.features import GlobalCmvn

    return {
        "cmvn": GlobalCmvn.from_dict(json.loads(meta["cmvn"])),
        "vocabulary": vocabulary_from_metadata(meta),
        "path": path,
        "chunk_ms": int(meta["chunk_ms"]),
        "left_chunks": int(meta["left_chunks"]),
        "cached": int(meta["cached"]),
    }


def check_exported_chunking(
    path: Path, chunk_ms: int, left_chunks: int, cached: int, max_cached: int
) -> None:
    """An exported step has its cache size built in: refuse other chunk settings, naming its."""
    if max_cached != cached:
        raise ValueError(
            f"{path} was exported for --chunk-ms {chunk_ms} --left-chunks {left_chunks}: "
            "transcribe with those, or export again with yours"
        )


def resolve_backend(name: str | Path, backend: str = "auto") -> str:
    """The backend that will run model `name`: "auto" goes by the file suffix."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    exported = SUFFIXES.get(Path(str(name).rstrip("/")).suffix)
    if backend == "auto":
        return exported or "torch"
    if backend in SUFFIXES.values() and exported != backend:
        suffix = next(s for s, b in SUFFIXES.items() if b == backend)
        raise ValueError(
            f"--backend {backend} runs an exported {suffix} model, got {str(name)!r}: "
            f"make one with `edgestream export asr --format {backend} --out DIR`"
        )
    if exported is not None and exported != backend:
        raise ValueError(f"{name} is an exported model: use --backend {exported} (or auto)")
    return backend


def load_streaming_model(
    name: str | Path = "default", backend: str = "auto", threads: int | None = None
) -> StreamingModel:
    """A model for the `Recognizer`: PyTorch (a bundled name or .safetensors file), the same
    weights in the accelerator layout ("accelerator", see `accelerator.py`), onnxruntime
    (a .onnx file from `edgestream export asr`) or Core ML (a .mlpackage, macOS only).
    `threads` sets onnxruntime's threads; PyTorch's are set with `torch.set_num_threads`."""
    backend = resolve_backend(name, backend)
    if backend == "onnx":
        from edgestream.asr.onnx_runtime import load_onnx_model

        return load_onnx_model(name, threads)
    if backend == "coreml":
        from edgestream.asr.coreml import load_coreml_model

        return load_coreml_model(name)
    from edgestream.asr.model_io import load_model

    asr = load_model(name)
    if backend == "accelerator":
        from edgestream.asr.accelerator import AcceleratorConformer

        asr.model = AcceleratorConformer(asr.model)  # type: ignore[assignment]
    return asr
