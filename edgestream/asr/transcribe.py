"""Transcribe audio files with the streaming recognizer, timing it as a live stream would be.

`transcribe_file` streams a file through a `Recognizer` in 100 ms pieces (as a microphone
would deliver it) and returns the text with its real-time factor and first-partial latency;
`on_partial` sees every change of the partial text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgestream.asr.audio import AudioStats, stream_audio
from edgestream.asr.streaming import Recognizer, StreamingModel, StreamingOptions

PIECE_SECONDS = 0.1


@dataclass(frozen=True)
class Transcript:
    audio: str
    text: str
    duration: float  # seconds of audio
    rtf: float  # processing seconds / audio seconds
    first_partial_ms: float | None  # see transcribe_file; None if nothing was recognised
    segments: tuple[str, ...]  # texts between endpoints
    warnings: tuple[str, ...]  # e.g. clipped or truncated input

    def to_json(self) -> dict[str, object]:
        return {
            "audio": self.audio,
            "text": self.text,
            "duration": round(self.duration, 3),
            "rtf": round(self.rtf, 4),
            "first_partial_ms": None
            if self.first_partial_ms is None
            else round(self.first_partial_ms),
        }


def transcribe_file(
    asr: StreamingModel,
    path: str | Path,
    options: StreamingOptions = StreamingOptions(),
    on_partial: Callable[[str], None] | None = None,
) -> Transcript:
    """Stream `path` through a fresh recognizer.

    first_partial_ms: when the first words would have appeared had the audio been live: the
    audio time at which the piece that produced them ended, plus the processing time that piece
    took (processing is counted as if it started when the piece arrived)."""
    recognizer = Recognizer(asr, options)
    stats = AudioStats(0, 0)
    processing, first_partial_ms, shown = 0.0, None, ""
    piece = int(PIECE_SECONDS * 16_000)
    for block in stream_audio(path, stats=stats):
        for start in range(0, len(block), piece):
            began = time.perf_counter()
            recognizer.accept_waveform(block[start : start + piece])
            spent = time.perf_counter() - began
            processing += spent
            text = recognizer.text
            if text != shown:
                if first_partial_ms is None:
                    first_partial_ms = 1000 * (recognizer.seconds + spent)
                shown = text
                if on_partial is not None:
                    on_partial(text)
    began = time.perf_counter()
    text = recognizer.finalize()
    processing += time.perf_counter() - began
    if first_partial_ms is None and text:
        first_partial_ms = 1000 * (recognizer.seconds + time.perf_counter() - began)
    if text != shown and on_partial is not None:  # the flushed last chunk added words
        on_partial(text)
    warnings = []
    if stats.clipped_fraction > 0.001:
        warnings.append(f"{stats.clipped_fraction:.1%} of the samples are clipped")
    if stats.truncated:
        warnings.append("the file is truncated: transcribed the part that is there")
    seconds = max(recognizer.seconds, 1e-9)
    return Transcript(
        str(path),
        text,
        recognizer.seconds,
        processing / seconds,
        first_partial_ms,
        tuple(recognizer.segments),
        tuple(warnings),
    )


def transcribe_samples(asr: StreamingModel, samples: np.ndarray, options: StreamingOptions) -> str:
    """16 kHz float samples -> text, through the streaming recognizer in one piece."""
    recognizer = Recognizer(asr, options)
    recognizer.accept_waveform(samples)
    return recognizer.finalize()
