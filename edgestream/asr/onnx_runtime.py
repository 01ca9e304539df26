"""Run an exported streaming step (see `export.py`) with onnxruntime: no PyTorch needed.

An `OnnxAsrModel` is a drop-in `StreamingModel` for the `Recognizer`: features, CMVN,
decoding and endpoints stay in numpy; only the encoder step runs in onnxruntime. Each stream's
`OnnxChunkEncoder` keeps the fixed-size caches the graph takes and returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgestream.asr.backends import check_exported_chunking, exported_fields
from edgestream.asr.decode import Vocabulary
from edgestream.asr.features import GlobalCmvn

ONNX_FORMAT = "edgestream-conformer-ctc-onnx/1"
INPUTS = ("features", "offset", "keys", "values", "conv", "valid")
OUTPUTS = ("log_probs", "new_keys", "new_values", "new_conv")


@dataclass
class OnnxAsrModel:
    session: ort.InferenceSession
    cmvn: GlobalCmvn
    vocabulary: Vocabulary
    info: dict[str, object]
    path: Path
    chunk_ms: int
    left_chunks: int
    cached: int  # encoder frames of attention context in the graph's caches
    cache_shapes: dict[str, tuple[int, ...]]  # keys, values, conv

    def chunk_encoder(self, max_cached: int) -> OnnxChunkEncoder:
        check_exported_chunking(self.path, self.chunk_ms, self.left_chunks, self.cached, max_cached)
        return OnnxChunkEncoder(self)


class OnnxChunkEncoder:
    """One stream's caches, right-aligned: `valid` is how many of the last slots hold frames."""

    def __init__(self, model: OnnxAsrModel) -> None:
        self.model = model
        self.caches = {
            name: np.zeros(shape, np.float32) for name, shape in model.cache_shapes.items()
        }
        self.valid = 0

    def __call__(self, window: np.ndarray, offset: int) -> np.ndarray:
        feeds = {
            "features": np.ascontiguousarray(window, np.float32)[None],
            "offset": np.array([offset], np.int64),
            **self.caches,
            "valid": np.array([self.valid], np.int64),
        }
        log_probs, keys, values, conv = self.model.session.run(OUTPUTS, feeds)
        self.caches = {"keys": keys, "values": values, "conv": conv}
        self.valid = min(self.model.cached, self.valid + log_probs.shape[1])
        return log_probs[0]


def load_onnx_model(path: str | Path, threads: int | None = None) -> OnnxAsrModel:
    """An exported `.onnx` file; `threads`: onnxruntime's intra-op threads (None: its default)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such ONNX model: {path}")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for bad files
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a loadable ONNX model ({message})") from error
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get("format") != ONNX_FORMAT:
        raise ValueError(
            f"{path} is not an edgestream ONNX export (format {meta.get('format')!r}): "
            "make one with `edgestream export asr`"
        )
    inputs = {i.name: i.shape for i in session.get_inputs()}
    return OnnxAsrModel(
        session=session,
        info=json.loads(meta["info"]),
        cache_shapes={name: tuple(inputs[name]) for name in ("keys", "values", "conv")},
        **exported_fields(meta, path),
    )
