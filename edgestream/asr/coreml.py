"""Core ML export of the streaming step (coremltools), and a runtime for it on macOS.

The step is the ONNX export's (`export.StreamingStep`: a chunk of fbank frames and the fixed-size
caches in, log-probs and new caches out) with one change: the rotary tables come in as inputs
(`cos`, `sin`, computed by the host in float64) instead of being computed in the graph. Core ML
has no float64, and in float32 the angle of an encoder frame an hour into a stream (position
~90,000) is off by up to ~0.01 rad; the host computes them exactly for any stream length.

Conversion works on Linux (tested in CI); running a Core ML model needs macOS, so
`load_coreml_model` refuses elsewhere with a message saying so, and the streaming test runs
only on macOS (skipped visibly here). coremltools is optional: `pip install coremltools`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import platform
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgestream.asr.backends import check_exported_chunking, exported_fields
from edgestream.asr.decode import Vocabulary
from edgestream.asr.features import GlobalCmvn
from edgestream.asr.frames import SUBSAMPLING_CONTEXT, SUBSAMPLING_FACTOR, encoder_frames

COREML_FORMAT = "edgestream-conformer-ctc-coreml/1"
INPUTS = ("features", "cos", "sin", "keys", "values", "conv", "valid")
OUTPUTS = ("log_probs", "new_keys", "new_values", "new_conv")
INSTALL = "Core ML export needs coremltools: pip install coremltools"


def host_rope_tables(
    head_dim: int, first: int, count: int, base: float
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (count, head_dim / 2) for positions first..first+count-1, as
    `conformer.rope_tables` computes them (float64 angles, float32 results)."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(first, first + count, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def export_coreml(asr: object, out_dir: Path, options: object, precision: str = "float32") -> Path:
    """Write `conformer-ctc.mlpackage` (an ML program, macOS 14 / iOS 17 or later) into out_dir;
    `precision` float32 or float16 (Core ML computes in it; inputs and outputs stay float32)."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)  # e.g. "no runtime on Linux"
    try:
        import coremltools as ct
    except ImportError:
        raise ValueError(INSTALL) from None
    import torch

    from edgestream.asr.export import HostRopeStep

    if precision not in ("float32", "float16"):
        raise ValueError(f"unknown Core ML precision {precision!r}: expected float32 or float16")
    chunk, cached = options.chunk_frames, options.left_chunks * options.chunk_frames
    step = HostRopeStep(asr.model.eval(), cached).eval()
    config = asr.model.config
    half_dim = config.d_model // config.num_heads // 2
    features, _, keys, values, conv, valid = step.example_inputs(chunk)
    cos = torch.ones(chunk, half_dim)
    example = (features, cos, torch.zeros(chunk, half_dim), keys, values, conv, valid)
    frames = ct.RangeDim(1, chunk, default=chunk)  # the last chunk of a stream is shorter
    window = ct.RangeDim(SUBSAMPLING_CONTEXT, features.shape[1], default=features.shape[1])
    shapes = {
        "features": (1, window, config.num_mel_bins),
        "cos": (frames, half_dim),
        "sin": (frames, half_dim),
        "keys": tuple(keys.shape),
        "values": tuple(values.shape),
        "conv": tuple(conv.shape),
    }
    # The tracer's and converter's advice and progress bars are not about the user's model;
    # exceptions still come through.
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(step, example)
        mlmodel = ct.convert(
            traced,
            inputs=[
                *(ct.TensorType(name=name, shape=shape) for name, shape in shapes.items()),
                ct.TensorType(name="valid", shape=(1,), dtype=np.int32),
            ],
            outputs=[ct.TensorType(name=name) for name in OUTPUTS],
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.macOS14,
            compute_precision=ct.precision.FLOAT16
            if precision == "float16"
            else ct.precision.FLOAT32,
            skip_model_load=True,  # loading compiles the model, which needs macOS
        )
    mlmodel.user_defined_metadata.update(
        {
            "format": COREML_FORMAT,
            "cmvn": json.dumps(asr.cmvn.to_dict()),
            **asr.vocabulary.to_metadata(),
            "config": json.dumps(config.to_dict()),
            "chunk_ms": str(options.chunk_ms),
            "left_chunks": str(options.left_chunks),
            "cached": str(cached),
            "precision": precision,
        }
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "conformer-ctc" + ("" if precision == "float32" else f".{precision}")
    path = out_dir / f"{name}.mlpackage"
    temporary = out_dir / f".{name}.tmp.mlpackage"  # coremltools insists on the suffix
    shutil.rmtree(temporary, ignore_errors=True)
    mlmodel.save(str(temporary))
    if path.exists():
        shutil.rmtree(path)
    os.replace(temporary, path)
    return path


@dataclass
class CoreMLAsrModel:
    """A `StreamingModel` running an exported `.mlpackage` with Core ML (macOS only)."""

    mlmodel: object
    cmvn: GlobalCmvn
    vocabulary: Vocabulary
    config: dict[str, object]
    path: Path
    chunk_ms: int
    left_chunks: int
    cached: int

    def chunk_encoder(self, max_cached: int) -> CoreMLChunkEncoder:
        check_exported_chunking(self.path, self.chunk_ms, self.left_chunks, self.cached, max_cached)
        return CoreMLChunkEncoder(self)


class CoreMLChunkEncoder:
    """One stream's fixed-size caches (right-aligned, `valid` of them real), as with ONNX."""

    def __init__(self, model: CoreMLAsrModel) -> None:
        c = model.config
        layers, heads, d_model = int(c["num_layers"]), int(c["num_heads"]), int(c["d_model"])
        self.model, self.head_dim = model, d_model // heads
        kv = np.zeros((layers, 1, heads, model.cached, self.head_dim), np.float32)
        self.caches = {
            "keys": kv,
            "values": kv.copy(),
            "conv": np.zeros((layers, 1, d_model, int(c["conv_kernel"]) - 1), np.float32),
        }
        self.valid = 0

    def __call__(self, window: np.ndarray, offset: int) -> np.ndarray:
        frames = encoder_frames(len(window))
        assert len(window) == SUBSAMPLING_FACTOR * (frames - 1) + SUBSAMPLING_CONTEXT
        cos, sin = host_rope_tables(
            self.head_dim, offset, frames, float(self.model.config["rope_base"])
        )
        feeds = {
            "features": np.ascontiguousarray(window, np.float32)[None],
            "cos": cos,
            "sin": sin,
            **self.caches,
            "valid": np.array([self.valid], np.int32),
        }
        out = self.model.mlmodel.predict(feeds)
        self.caches = {name: out[f"new_{name}"] for name in ("keys", "values", "conv")}
        self.valid = min(self.model.cached, self.valid + frames)
        return np.asarray(out["log_probs"])[0]


def load_coreml_model(path: str | Path) -> CoreMLAsrModel:
    """An exported `.mlpackage`; Core ML runs only on macOS, so elsewhere this says so."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such Core ML model: {path}")
    if platform.system() != "Darwin":
        raise ValueError(
            f"{path}: running a Core ML model needs macOS (this is {platform.system()}); "
            "export ONNX for this machine: `edgestream export asr --out DIR`"
        )
    try:
        import coremltools as ct
    except ImportError:
        raise ValueError(INSTALL) from None
    mlmodel = ct.models.MLModel(str(path))
    meta = dict(mlmodel.user_defined_metadata)
    if meta.get("format") != COREML_FORMAT:
        raise ValueError(f"{path} is not an edgestream Core ML export: `edgestream export asr`")
    return CoreMLAsrModel(
        mlmodel=mlmodel, config=json.loads(meta["config"]), **exported_fields(meta, path)
    )
