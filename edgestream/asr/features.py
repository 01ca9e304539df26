"""Log-mel filterbank features, computed incrementally for streaming, and global CMVN.

80 log-mel bins from 25 ms Povey-windowed frames every 10 ms at 16 kHz (Kaldi's fbank, as
WeNet, icefall and sherpa-onnx use), computed by `kaldi-native-fbank` (k2-fsa, Apache-2.0).
Why that library and not torch ops: it is built for online use (`OnlineFbank` takes samples in
pieces and emits each frame once its 400 samples have arrived), computes every frame on its own
in C++, so streaming output equals one-shot output bit for bit whatever the piece lengths (a
torch version batching frames into one matmul may round differently with the batch size), runs
about 800x real time on one core here, and needs no torch at the front end. `snip_edges` is on
(frames only over whole windows: nothing to revise when more audio arrives).

Input is float samples in [-1, 1]; they are scaled to the 16-bit range first, Kaldi's
convention. Dither is Kaldi's (Gaussian, 1 LSB) but deterministic: the noise added to sample i
is entry i of a fixed table, so features stay a pure function of the waveform and streaming
still equals one-shot. Without it digital silence hits the log floor (-15.9 in every bin), far
outside anything seen in training, and the model hallucinated letters there (measured: a
file of zeros was heard as "e"); with it silence looks like the quiet noise it was trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kaldi_native_fbank as knf
import numpy as np
import soundfile as sf

from edgestream.asr.manifest import read_manifest

SAMPLE_RATE = 16_000
NUM_MEL_BINS = 80
FRAME_LENGTH_MS = 25.0
FRAME_SHIFT_MS = 10.0
WINDOW_SAMPLES = SAMPLE_RATE * 25 // 1000  # 400
HOP_SAMPLES = SAMPLE_RATE * 10 // 1000  # 160
_INT16_SCALE = 32768.0
DITHER_LSB = 1.0  # standard deviation of the dither, in 16-bit steps (Kaldi's default)
_DITHER_TABLE = (np.random.default_rng(20_261_129).standard_normal(1 << 16) * DITHER_LSB).astype(
    np.float32
)


def dither(start: int, count: int) -> np.ndarray:
    """The dither for samples start..start+count-1 (16-bit units): a fixed, repeating table."""
    index = (start + np.arange(count)) % len(_DITHER_TABLE)
    return _DITHER_TABLE[index]


def num_frames(num_samples: int) -> int:
    """Frames for `num_samples` samples: whole 400-sample windows every 160 samples.

    >>> [num_frames(n) for n in (0, 399, 400, 559, 560, 16000)]
    [0, 0, 1, 1, 2, 98]
    """
    return 0 if num_samples < WINDOW_SAMPLES else 1 + (num_samples - WINDOW_SAMPLES) // HOP_SAMPLES


def _fbank_options() -> knf.FbankOptions:
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.frame_length_ms = FRAME_LENGTH_MS
    options.frame_opts.frame_shift_ms = FRAME_SHIFT_MS
    options.frame_opts.dither = 0.0  # ours is added by position instead (see `dither`)
    options.frame_opts.snip_edges = True  # no frame ever depends on samples not yet seen
    options.mel_opts.num_bins = NUM_MEL_BINS
    return options


def _check_samples(samples: np.ndarray) -> np.ndarray:
    if not isinstance(samples, np.ndarray) or samples.ndim != 1:
        shape = getattr(samples, "shape", type(samples).__name__)
        raise ValueError(f"expected mono samples of shape (samples,), got {shape}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"expected float samples in [-1, 1], got dtype {samples.dtype}")
    return samples.astype(np.float32) * _INT16_SCALE


class StreamingFbank:
    """Log-mel frames from audio that arrives in pieces of any length.

    `accept_waveform` returns the frames completed by each piece, shape (new_frames, 80)
    float32; their concatenation equals `compute_fbank` on the whole signal. Emitted frames are
    dropped from the extractor, so memory stays flat over an hour-long stream.
    """

    def __init__(self) -> None:
        self._fbank = knf.OnlineFbank(_fbank_options())
        self.frames_emitted = 0
        self.samples_accepted = 0

    def accept_waveform(self, samples: np.ndarray) -> np.ndarray:
        """samples: float (n,) at 16 kHz in [-1, 1] -> the new frames, float32 (new, 80)."""
        scaled = _check_samples(samples) + dither(self.samples_accepted, len(samples))
        self.samples_accepted += len(samples)
        self._fbank.accept_waveform(SAMPLE_RATE, scaled)
        ready = self._fbank.num_frames_ready
        frames = np.empty((ready - self.frames_emitted, NUM_MEL_BINS), np.float32)
        for row, index in enumerate(range(self.frames_emitted, ready)):
            frames[row] = self._fbank.get_frame(index)
        self._fbank.pop(len(frames))  # frees them; indices stay absolute
        self.frames_emitted = ready
        return frames


def compute_fbank(samples: np.ndarray) -> np.ndarray:
    """samples: float (n,) at 16 kHz in [-1, 1] -> float32 (num_frames(n), 80) log-mel."""
    return StreamingFbank().accept_waveform(samples)


def load_audio(path: str | Path) -> np.ndarray:
    """A 16 kHz mono file as float32 (samples,) in [-1, 1]."""
    samples, rate = sf.read(str(path), dtype="float32", always_2d=True)
    if rate != SAMPLE_RATE or samples.shape[1] != 1:
        raise ValueError(
            f"{path}: expected 16000 Hz mono, got {rate} Hz with {samples.shape[1]} channels"
        )
    return samples[:, 0]


@dataclass(frozen=True, eq=False)
class GlobalCmvn:
    """Global mean and variance normalisation of fbank frames, stored with the model.

    mean, std: float32 (80,); `frames`: how many frames they were estimated from.
    """

    mean: np.ndarray
    std: np.ndarray
    frames: int

    def __post_init__(self) -> None:
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value.shape != (NUM_MEL_BINS,):
                raise ValueError(f"expected {name} of shape ({NUM_MEL_BINS},), got {value.shape}")
        if not np.all(self.std > 0):
            raise ValueError("expected std > 0 in every bin")

    def normalize(self, features: np.ndarray) -> np.ndarray:
        """features: (frames, 80) -> float32 (frames, 80), zero mean and unit variance."""
        return ((features - self.mean) / self.std).astype(np.float32)

    @classmethod
    def from_features(cls, batches: Iterable[np.ndarray], floor: float = 1e-5) -> GlobalCmvn:
        """Estimate in one pass over fbank matrices, each (frames, 80); std floored at
        `floor`."""
        # float64 sums: millions of frames in float32 lose the variance to cancellation.
        sums, squares, total = np.zeros(NUM_MEL_BINS), np.zeros(NUM_MEL_BINS), 0
        for batch in batches:
            sums += batch.sum(axis=0, dtype=np.float64)
            squares += np.square(batch, dtype=np.float64).sum(axis=0)
            total += len(batch)
        if total == 0:
            raise ValueError("expected at least one frame to estimate CMVN, got none")
        mean = sums / total
        std = np.sqrt(np.maximum(squares / total - mean**2, floor**2))
        return cls(mean.astype(np.float32), std.astype(np.float32), total)

    @classmethod
    def from_manifest(cls, manifest: str | Path, max_utterances: int | None = None) -> GlobalCmvn:
        """Estimate from the audio of a manifest (paths relative to it); with
        `max_utterances`, from that many evenly spaced entries."""
        entries = read_manifest(manifest)
        if max_utterances is not None and len(entries) > max_utterances:
            step = len(entries) / max_utterances
            entries = [entries[int(i * step)] for i in range(max_utterances)]
        root = Path(manifest).parent
        return cls.from_features(compute_fbank(load_audio(root / e.audio)) for e in entries)

    def to_dict(self) -> dict[str, object]:
        # Python floats print as the shortest exact repr, so float32 values round-trip.
        return {
            "mean": [float(x) for x in self.mean],
            "std": [float(x) for x in self.std],
            "frames": self.frames,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GlobalCmvn:
        missing = {"mean", "std", "frames"} - set(data)
        if missing:
            raise ValueError(f"expected CMVN keys mean, std, frames; missing {sorted(missing)}")
        return cls(
            np.asarray(data["mean"], np.float32),
            np.asarray(data["std"], np.float32),
            int(data["frames"]),
        )

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (temporary file, then rename)."""
        path = Path(path)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(self.to_dict()) + "\n", "utf-8")
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: str | Path) -> GlobalCmvn:
        if not Path(path).is_file():
            raise FileNotFoundError(f"expected a CMVN JSON file at {path}, found none")
        return cls.from_dict(json.loads(Path(path).read_text("utf-8")))
