"""Transcribe audio files with the streaming recognizer, timing it as a live stream would be.

`transcribe_file` streams a file (or standard input, `-`) through a `Recognizer` in 100 ms
pieces, as a microphone would deliver it, and returns the text with its real-time factor and
first-partial latency; `on_partial` sees every change of the partial text and `on_segment`,
for live output, each segment as an endpoint closes it.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgestream.asr.audio import STDIN, AudioStats, stream_audio
from edgestream.asr.streaming import Recognizer, Segment, StreamingModel, StreamingOptions

PIECE_SECONDS = 0.1


@dataclass(frozen=True)
class Transcript:
    audio: str
    text: str
    duration: float  # seconds of audio
    rtf: float  # processing seconds / audio seconds
    first_partial_ms: float | None  # see transcribe_file; None if nothing was recognised
    segments: tuple[str, ...]  # the text, split where endpoints fell
    warnings: tuple[str, ...]  # e.g. clipped or truncated input
    interrupted: bool = False  # `stop` was set before the audio ended

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
    on_segment: Callable[[Segment], None] | None = None,
    stop: threading.Event | None = None,
) -> Transcript:
    """Stream `path` (`-`: standard input, until it ends) through a fresh recognizer.

    Without `on_segment`, `on_partial` gets the whole text so far. With it, each segment goes
    to `on_segment` once, with where it was heard, as an endpoint closes it (the last one at
    the end), and `on_partial`
    gets only the open segment's text: a live display then never repeats what it has
    printed, however long the stream. `stop` ends the stream early, between pieces, and the
    text recognised so far is finalized as if the audio had ended there.

    first_partial_ms: when the first words would have appeared had the audio been live: the
    audio time at which the piece that produced them ended, plus the processing time that piece
    took (processing is counted as if it started when the piece arrived)."""
    recognizer = Recognizer(asr, options)
    stats = AudioStats(0, 0)
    processing, first_partial_ms, shown, emitted = 0.0, None, "", 0

    def report_progress() -> None:
        nonlocal shown, emitted
        if on_segment is not None:
            for index in range(emitted, len(recognizer.segments)):
                on_segment(recognizer.segment(index))
            emitted = len(recognizer.segments)
        text = recognizer.text if on_segment is None else recognizer.partial
        if text != shown:
            shown = text
            # An open segment emptied by an endpoint says nothing that on_segment did not.
            if on_partial is not None and (text or on_segment is None):
                on_partial(text)

    piece = int(PIECE_SECONDS * 16_000)
    blocks = stream_audio(path, PIECE_SECONDS, stats)
    if str(path) == STDIN:
        blocks = _read_ahead(blocks, stop)
    for block in blocks:
        for start in range(0, len(block), piece):
            began = time.perf_counter()
            recognizer.accept_waveform(block[start : start + piece])
            spent = time.perf_counter() - began
            processing += spent
            if first_partial_ms is None and (recognizer.segments or recognizer.partial):
                first_partial_ms = 1000 * (recognizer.seconds + spent)
            report_progress()
        if stop is not None and stop.is_set():
            break
    began = time.perf_counter()
    text = recognizer.finalize()
    processing += time.perf_counter() - began
    if first_partial_ms is None and text:
        first_partial_ms = 1000 * (recognizer.seconds + time.perf_counter() - began)
    report_progress()  # the flushed last chunk may have added words
    last = recognizer.partial_segment
    if on_segment is not None and last is not None:
        on_segment(last)
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
        (*recognizer.segments, *([recognizer.partial] if recognizer.partial else [])),
        tuple(warnings),
        interrupted=stop is not None and stop.is_set(),
    )


def _read_ahead(blocks: Iterator[np.ndarray], stop: threading.Event | None) -> Iterator[np.ndarray]:
    """`blocks`, read by a thread of their own: a live stream goes on being read while the
    caller is busy (answering the question a segment asked, say), so the recorder never blocks
    on a full pipe and drops audio. Returns early once `stop` is set."""
    pending: queue.Queue[np.ndarray | Exception | None] = queue.Queue()

    def read() -> None:
        try:
            for block in blocks:
                pending.put(block)
        except Exception as error:  # raised again in the caller's thread
            pending.put(error)
            return
        pending.put(None)

    threading.Thread(target=read, name="read-ahead", daemon=True).start()
    while True:
        try:
            item = pending.get(timeout=0.2)
        except queue.Empty:
            if stop is not None and stop.is_set():
                return
            continue
        if item is None:
            return
        if isinstance(item, Exception):
            raise item
        yield item


@contextmanager
def interrupt_stops(stop: threading.Event) -> Iterator[None]:
    """Within this block a first Ctrl-C (SIGINT) sets `stop` instead of raising, so a live
    transcription ends cleanly after the piece in hand; a second one raises as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals
        return

    def handle(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def transcribe_samples(asr: StreamingModel, samples: np.ndarray, options: StreamingOptions) -> str:
    """16 kHz float samples -> text, through the streaming recognizer in one piece."""
    recognizer = Recognizer(asr, options)
    recognizer.accept_waveform(samples)
    return recognizer.finalize()
