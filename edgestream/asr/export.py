"""Export the recognizer's streaming step to ONNX (float32, and float16 or int8 variants).

What is exported is one chunk step, not the offline model: fbank frames of one chunk and the
stream's caches in, CTC log-probs and the new caches out, so an edge runtime streams exactly
as `Recognizer` does. A graph cannot hold Python lists of growing tensors, so `StreamingStep`
keeps fixed-size caches: per layer the last `left_chunks x chunk` keys and values,
right-aligned, with `valid` saying how many of the last slots hold real frames (the others
are masked out of attention), and the causal convolution's last inputs. The chunk length is
a dynamic axis, so the shorter last chunk of a stream runs through the same graph.

Everything the runtime needs besides the graph (CMVN, vocabulary, chunk settings) travels in
the ONNX file's metadata, so a model is one file, as with the safetensors model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.asr.conformer import (
    SUBSAMPLING_CONTEXT,
    SUBSAMPLING_FACTOR,
    ConformerCTC,
    LayerCache,
    rope_tables,
)
from edgestream.asr.model_io import AsrModel
from edgestream.asr.onnx_runtime import INPUTS, ONNX_FORMAT, OUTPUTS, load_onnx_model
from edgestream.asr.streaming import StreamingOptions

PRECISIONS = ("float32", "float16", "int8")


class StreamingStep(nn.Module):
    """`ConformerCTC.forward_chunk` (with the subsampling before it) over fixed-size caches."""

    def __init__(self, model: ConformerCTC, cached: int) -> None:
        super().__init__()
        self.model, self.cached = model, cached

    def forward(
        self, features: Tensor, offset: Tensor, keys: Tensor, values: Tensor, conv: Tensor,
        valid: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """features (1, 4t + 3, 80); offset, valid: int64 of shape (1,); keys, values
        (layers, 1, heads, cached, head_dim); conv (layers, 1, d_model, kernel - 1)."""
        config = self.model.config
        x = self.model.subsampling(features)
        rope = rope_tables(
            config.d_model // config.num_heads, offset + torch.arange(x.shape[1]), config.rope_base
        )
        return self.step(x, rope, keys, values, conv, valid)

    def step(
        self, x: Tensor, rope: tuple[Tensor, Tensor], keys: Tensor, values: Tensor, conv: Tensor,
        valid: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """The blocks and the head over subsampled frames x (1, t, d_model)."""
        model, t = self.model, x.shape[1]
        slots = torch.arange(self.cached)
        visible = torch.cat([slots >= self.cached - valid, torch.ones(t, dtype=torch.bool)])
        mask = visible[None, None, None, :].expand(1, 1, t, self.cached + t)
        new_keys, new_values, new_conv = [], [], []
        for i, block in enumerate(model.blocks):
            x, cache = block(x, rope, mask, LayerCache(keys[i], values[i], conv[i]))
            new_keys.append(cache.keys[:, :, t:])  # the oldest t slots fall out
            new_values.append(cache.values[:, :, t:])
            new_conv.append(cache.conv)
        log_probs = F.log_softmax(model.head(x), dim=-1)
        return log_probs, torch.stack(new_keys), torch.stack(new_values), torch.stack(new_conv)

    def example_inputs(self, frames: int) -> tuple[Tensor, ...]:
        c = self.model.config
        head_dim = c.d_model // c.num_heads
        window = SUBSAMPLING_FACTOR * (frames - 1) + SUBSAMPLING_CONTEXT
        kv = torch.zeros(c.num_layers, 1, c.num_heads, self.cached, head_dim)
        return (
            torch.zeros(1, window, c.num_mel_bins),
            torch.tensor([0]),
            kv,
            kv.clone(),
            torch.zeros(c.num_layers, 1, c.d_model, c.conv_kernel - 1),
            torch.tensor([0]),
        )


class HostRopeStep(StreamingStep):
    """`StreamingStep` taking the rotary tables (cos, sin: (t, head_dim / 2)) as inputs, for
    runtimes without float64 (Core ML: see `coreml.py`)."""

    def forward(  # type: ignore[override]
        self, features: Tensor, cos: Tensor, sin: Tensor, keys: Tensor, values: Tensor,
        conv: Tensor, valid: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        x = self.model.subsampling(features)
        return self.step(x, (cos, sin), keys, values, conv, valid)


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """The exporter and quantizer log advice (missing torchvision ops, pre-processing hints,
    deprecations) that is not about the user's model; errors still come through."""
    loggers = [logging.getLogger(name) for name in ("", "torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(
    asr: AsrModel,
    out_dir: Path,
    options: StreamingOptions = StreamingOptions(),
    precisions: tuple[str, ...] = ("float32",),
) -> dict[str, Path]:
    """Write `conformer-ctc.onnx` (float32) and any of `.float16.onnx`, `.int8.onnx` into
    out_dir (atomically); returns {precision: path}."""
    unknown = set(precisions) - set(PRECISIONS)
    if unknown:
        raise ValueError(f"unknown precision {sorted(unknown)}: expected some of {PRECISIONS}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with _quiet_exporters():
        return _export(asr, out_dir, options, precisions)


def _export(
    asr: AsrModel, out_dir: Path, options: StreamingOptions, precisions: tuple[str, ...]
) -> dict[str, Path]:
    cached = options.left_chunks * options.chunk_frames
    step = StreamingStep(asr.model.eval(), cached).eval()
    float32 = out_dir / "conformer-ctc.onnx"
    frames = torch.export.Dim("window", min=SUBSAMPLING_CONTEXT, max=4096)
    exported = torch.onnx.export(
        step,
        step.example_inputs(options.chunk_frames),
        dynamo=True,
        input_names=list(INPUTS),
        output_names=list(OUTPUTS),
        dynamic_shapes=({1: frames}, None, None, None, None, None),
        verbose=False,
    )
    metadata = {
        "format": ONNX_FORMAT,
        "cmvn": json.dumps(asr.cmvn.to_dict()),
        **asr.vocabulary.to_metadata(),
        "config": json.dumps(asr.model.config.to_dict()),
        "chunk_ms": str(options.chunk_ms),
        "left_chunks": str(options.left_chunks),
        "cached": str(cached),
        "info": json.dumps({"exported_from": asr.path.name, "trained": asr.info}),
    }
    written = {"float32": _save(exported.model_proto, float32, metadata, "float32")}
    if "float16" in precisions:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        # Inputs and outputs stay float32, so the runtime code is the same for every precision.
        half = convert_float_to_float16(onnx.load(str(float32)), keep_io_types=True)
        written["float16"] = _save(
            half, out_dir / "conformer-ctc.float16.onnx", metadata, "float16"
        )
    if "int8" in precisions:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        int8 = out_dir / "conformer-ctc.int8.onnx"
        temporary = int8.with_name(f".{int8.name}.quantizing")
        # Dynamic quantization: int8 weights, activations quantized per call; MatMul only,
        # since onnxruntime's int8 convolutions are slower than float ones on CPU.
        quantize_dynamic(
            float32, temporary, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"]
        )
        written["int8"] = _save(onnx.load(str(temporary)), int8, metadata, "int8")
        temporary.unlink()
    return {p: written[p] for p in PRECISIONS if p in written}


def _save(model: onnx.ModelProto, path: Path, metadata: dict[str, str], precision: str) -> Path:
    del model.metadata_props[:]
    for key, value in {**metadata, "precision": precision}.items():
        model.metadata_props.add(key=key, value=value)
    temporary = path.with_name(f".{path.name}.tmp")
    onnx.save(model, str(temporary))
    os.replace(temporary, path)
    return path


def max_step_difference(
    asr: AsrModel, path: Path, options: StreamingOptions, chunks: int = 4
) -> float:
    """Largest |log-prob| difference between PyTorch and onnxruntime over `chunks` chunks of
    random features (then a shorter last chunk): a self-check after export."""
    onnx_model = load_onnx_model(path, threads=1)
    torch_encoder = asr.chunk_encoder(onnx_model.cached)
    onnx_encoder = onnx_model.chunk_encoder(onnx_model.cached)
    rng = np.random.default_rng(0)
    worst, offset = 0.0, 0
    for frames in [options.chunk_frames] * chunks + [max(1, options.chunk_frames // 3)]:
        window = rng.standard_normal(
            (SUBSAMPLING_FACTOR * (frames - 1) + SUBSAMPLING_CONTEXT, asr.model.config.num_mel_bins)
        ).astype(np.float32)
        expected, got = torch_encoder(window, offset), onnx_encoder(window, offset)
        worst = max(worst, float(np.abs(expected - got).max()))
        offset += frames
    return worst
