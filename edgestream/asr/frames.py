"""Frame arithmetic shared by the model and the runtimes, in plain Python (no PyTorch), so
the onnxruntime path runs without importing it.

Fbank frames come every 10 ms; the subsampling's two unpadded kernel-3, stride-2 convolutions
turn them into encoder frames every 40 ms, encoder frame i reading fbank frames 4i..4i+6.
"""

from __future__ import annotations

SUBSAMPLING_FACTOR = 4
SUBSAMPLING_CONTEXT = 7  # fbank frames behind one subsampled frame (two kernel-3, stride-2 convs)
ENCODER_FRAME_MS = 40  # 10 ms fbank hop x subsampling by 4


def encoder_frames(fbank_frames: int) -> int:
    """Encoder frames computable from `fbank_frames` fbank frames.

    >>> [encoder_frames(n) for n in (0, 6, 7, 10, 11, 100)]
    [0, 0, 1, 1, 2, 24]
    """
    return max(0, (fbank_frames - SUBSAMPLING_CONTEXT) // SUBSAMPLING_FACTOR + 1)
