"""Live transcription through a pipe: how soon after a speaker stops does the text appear?

`edgestream bench live` plays utterances into `edgestream transcribe -` at real time, as a
recorder would: one WAV stream of unknown length, each utterance followed by a pause, written
in 100 ms pieces by the wall clock. It timestamps every line the recognizer prints and reports,
per utterance, how long after its speech ended its segment appeared (`segment_delay_s`) and
how long after its speech began the first words did (`first_words_s`), with the WER of the live
text. Speech is where Silero VAD hears it (the files have a little silence at either end), timed
from the moment the 100 ms piece holding its last (first) sample was written: a microphone
delivers a piece when it ends, so a user waits up to 0.1 s more. The recognizer runs in a
process of its own, as a user's would, so the numbers include the pipe, the reads and the
output; the model loads during a lead-in of silence, which is not timed.
"""

from __future__ import annotations

import json
import statistics
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO

import jiwer
import numpy as np

from edgestream.asr.audio import SAMPLE_RATE, read_audio
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.vad import WINDOW, SileroVad
from edgestream.bench.asr import Utterance, normalize_text

PIECE_SAMPLES = SAMPLE_RATE // 10  # 100 ms, as transcribe reads a pipe
LEAD_IN_S = 5.0  # silence first, while the recognizer loads its model
UNKNOWN_SIZE = 0xFFFFFFFF  # a WAV stream's size fields when its length is not known


def wav_stream_header(rate: int = SAMPLE_RATE) -> bytes:
    """The header arecord writes for 16-bit mono PCM of unknown length."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", UNKNOWN_SIZE)
    )


@dataclass
class Played:
    """Wall-clock times (time.monotonic) at which the pieces holding an utterance's first and
    last speech samples were written into the pipe."""

    start: float = 0.0
    end: float = 0.0


def speech_bounds(samples: np.ndarray, vad: SileroVad) -> tuple[int, int]:
    """The first and last sample of the windows Silero VAD takes for speech (the whole
    utterance if it hears none)."""
    speech = np.nonzero(vad.stream().accept(samples) >= vad.threshold)[0]
    if not len(speech):
        return 0, len(samples) - 1
    return int(speech[0]) * WINDOW, min(len(samples), (int(speech[-1]) + 1) * WINDOW) - 1


def play(pipe: IO[bytes], utterances: list[np.ndarray], pause_s: float) -> list[Played]:
    """Write the utterances as one live stream, paced at real time; returns when each one's
    speech was written. A write that blocks (the recognizer still loading, its pipe full)
    restarts the pacing from then, so the stream never bursts to catch up."""
    vad = SileroVad()
    bounds = [speech_bounds(samples, vad) for samples in utterances]
    pipe.write(wav_stream_header())
    pause = np.zeros(int(pause_s * SAMPLE_RATE), np.float32)
    lead_in = np.zeros(int(LEAD_IN_S * SAMPLE_RATE), np.float32)
    played, due = [Played() for _ in utterances], time.monotonic()
    parts = [(None, lead_in)] + [
        part for i, u in enumerate(utterances) for part in ((i, u), (None, pause))
    ]
    for index, samples in parts:
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        for start in range(0, len(pcm), PIECE_SAMPLES):
            time.sleep(max(0.0, due - time.monotonic()))
            pipe.write(pcm[start : start + PIECE_SAMPLES].tobytes())
            pipe.flush()
            now = time.monotonic()
            due = max(due + PIECE_SAMPLES / SAMPLE_RATE, now)
            if index is not None:
                first, last = bounds[index]
                if start <= first < start + PIECE_SAMPLES:
                    played[index].start = now
                if start <= last < start + PIECE_SAMPLES:
                    played[index].end = now
    pipe.close()
    return played


def read_lines(pipe: IO[bytes], lines: list[tuple[float, dict[str, object]]]) -> None:
    """Collect the recognizer's JSON lines with the time each arrived."""
    for raw in pipe:
        lines.append((time.monotonic(), json.loads(raw)))


def measure_live(
    utterances: list[Utterance],
    model: str = "default",
    threads: int = 1,
    pause_s: float = 2.0,
    endpoint_silence: float | None = None,
) -> dict[str, object]:
    """Play `utterances` into `edgestream transcribe -` at real time; the report."""
    endpoint = endpoint_silence or StreamingOptions.silence_after_text_s
    if pause_s < endpoint + 0.3:
        raise ValueError(
            f"--pause must be at least {endpoint + 0.3:.1f} s (an endpoint needs {endpoint}), "
            f"got {pause_s}"
        )
    audio = [read_audio(u.audio) for u in utterances]
    command = [sys.executable, "-m", "edgestream", "transcribe", "-", "--json", "--stream"]
    command += ["--model", model, "--threads", str(threads)]
    if endpoint_silence is not None:
        command += ["--endpoint-silence", str(endpoint_silence)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    lines: list[tuple[float, dict[str, object]]] = []
    reader = threading.Thread(target=read_lines, args=(process.stdout, lines))
    reader.start()
    try:
        played = play(process.stdin, audio, pause_s)
    except BrokenPipeError:
        played = []
    reader.join()
    if process.wait() != 0 or not played:
        error = process.stderr.read().decode().strip() if process.stderr else ""
        raise RuntimeError(f"edgestream transcribe - failed: {error.splitlines()[-1:]}")
    return {"endpoint_silence_s": endpoint, **live_report(utterances, played, lines)}


def live_report(
    utterances: list[Utterance],
    played: list[Played],
    lines: list[tuple[float, dict[str, object]]],
) -> dict[str, object]:
    """Per utterance: the first segment printed after its last piece (and before the next
    one's) and the first partial after its first piece, as delays in seconds."""
    segments = [at for at, line in lines if "segment" in line]
    partials = [at for at, line in lines if line.get("partial")]
    rows = []
    for index, (utterance, times) in enumerate(zip(utterances, played, strict=True)):
        until = played[index + 1].end if index + 1 < len(played) else float("inf")
        closed = next((at for at in segments if times.end < at <= until), None)
        heard = next((at for at in partials if at > times.start), None)
        rows.append(
            {
                "audio": str(utterance.audio),
                "speech_s": round(times.end - times.start, 2),
                "segment_delay_s": None if closed is None else round(closed - times.end, 3),
                "first_words_s": None if heard is None else round(heard - times.start, 3),
            }
        )
    final = lines[-1][1]
    reference = normalize_text(" ".join(u.text for u in utterances))
    delays = [r["segment_delay_s"] for r in rows if r["segment_delay_s"] is not None]
    first_words = [r["first_words_s"] for r in rows if r["first_words_s"] is not None]
    return {
        "utterances": len(utterances),
        "segments": len(segments),
        "wer": float(jiwer.wer(reference, normalize_text(str(final["text"])))),
        "rtf": final["rtf"],
        "segment_delay_s": _summary(delays),
        "first_words_s": _summary(first_words),
        "rows": rows,
    }


def _summary(values: list[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {
        "mean": round(statistics.fmean(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "count": len(values),
    }
