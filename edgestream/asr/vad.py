"""Voice activity detection with Silero VAD, for endpointing (optional: `pip install silero-vad`).

The model is the ONNX file that ships inside the `silero-vad` package, run here by onnxruntime
on numpy arrays, so neither PyTorch nor a download is needed. The package itself is not
imported: its `__init__` imports PyTorch and sets PyTorch's thread count as a side effect.

The model reads 512-sample windows (32 ms at 16 kHz) together with the 64 samples before them
and carries a recurrent state; `VadStream` keeps both per audio stream, so audio may arrive in
pieces of any length and the probabilities equal those of the whole signal at once (tested).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
WINDOW = 512  # samples per speech probability (32 ms)
CONTEXT = 64  # samples of the previous window the model reads with each window
INSTALL = "voice activity detection needs the silero-vad package: pip install silero-vad"


def silero_model_path() -> Path:
    """The ONNX model inside the installed `silero-vad` package (located without importing it)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(INSTALL)
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise ValueError(f"the silero-vad package has no model at {path}: reinstall it")
    return path


class SileroVad:
    """One onnxruntime session, shared by every stream (`stream()` makes a stream's state)."""

    def __init__(self, threshold: float = 0.5, threads: int = 1) -> None:
        if not 0 < threshold < 1:
            raise ValueError(f"expected a VAD threshold in (0, 1), got {threshold}")
        import onnxruntime as ort  # here: a recognizer without VAD need not load it

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(silero_model_path()), options, providers=["CPUExecutionProvider"]
        )
        self.threshold = threshold

    def stream(self) -> VadStream:
        return VadStream(self)


class VadStream:
    """Speech probabilities of one audio stream, one per completed 512-sample window."""

    def __init__(self, vad: SileroVad) -> None:
        self.vad = vad
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self.windows = 0  # windows scored so far

    def accept(self, samples: np.ndarray) -> np.ndarray:
        """16 kHz mono samples -> the probabilities of the windows they complete."""
        self._pending = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        complete = len(self._pending) // WINDOW
        probabilities = np.empty(complete, np.float32)
        for k in range(complete):
            window = self._pending[k * WINDOW : (k + 1) * WINDOW]
            feeds = {
                "input": np.concatenate([self._context, window])[None],
                "state": self._state,
                "sr": np.array(SAMPLE_RATE, np.int64),
            }
            output, self._state = self.vad.session.run(None, feeds)
            probabilities[k] = output[0, 0]
            self._context = window[-CONTEXT:]
        self._pending = self._pending[complete * WINDOW :]
        self.windows += complete
        return probabilities
