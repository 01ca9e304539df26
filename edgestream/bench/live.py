"""Live transcription through a pipe: how soon after a speaker stops does the text appear?

`edgestream bench live` plays utterances into `edgestream transcribe -` at real time, as a
recorder would: one WAV stream of unknown length, each utterance followed by a pause, written
in 100 ms pieces by the wall clock. It timestamps every line the recognizer prints and reports,
per utterance, how long after its speech ended its segment appeared (`segment_delay_s`) and
how long after its speech began the first words did (`first_words_s`), with the WER of the live
text. With `--assist-tokens N` it plays them into `edgestream assist -` instead and also times
the answer: how long after the speech ended its first text was printed (`answer_delay_s`: the
endpoint, rescoring, the prompt's prefill and the first tokens).

Speech is where Silero VAD hears it (the files have a little silence at either end), timed from
the moment the 100 ms piece holding its last (first) sample was written: a microphone delivers
a piece when it ends, so a user waits up to 0.1 s more. The program under test runs in a
process of its own, as a user's would, so the numbers include the pipe, the reads and the
output; its models load during a lead-in of silence, which is not timed.
"""

from __future__ import annotations

import codecs
import json
import os
import re
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
    last speech samples were written into the pipe, and where those samples are in the
    stream, in seconds of audio."""

    start: float = 0.0
    end: float = 0.0
    speech_at: tuple[float, float] = (0.0, 0.0)


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
    written = 0  # samples
    for index, samples in parts:
        if index is not None:
            first, last = bounds[index]
            played[index].speech_at = (
                (written + first) / SAMPLE_RATE,
                (written + last) / SAMPLE_RATE,
            )
        written += len(samples)
        pcm = np.round(np.clip(samples, -1, 1) * 32767).astype("<i2")  # as a recorder rounds
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


def read_output(pipe: IO[bytes], chunks: list[tuple[float, bytes]]) -> None:
    """Collect what the process prints, unbuffered, with the time each piece arrived."""
    while chunk := os.read(pipe.fileno(), 65_536):
        chunks.append((time.monotonic(), chunk))


def transcript_events(chunks: list[tuple[float, bytes]]) -> list[tuple[float, dict[str, object]]]:
    """`transcribe - --json --stream`'s lines, each at the time its newline arrived."""
    events, line = [], b""
    for at, chunk in chunks:
        *complete, line = (line + chunk).split(b"\n")
        events += [(at, json.loads(raw)) for raw in complete if raw.strip()]
    return events


def conversation_events(chunks: list[tuple[float, bytes]]) -> list[tuple[float, dict[str, object]]]:
    """`assist -`'s conversation as events: each "you: ..." line (a segment) at the time its
    newline arrived, and the answer's first printed character after it."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    text, times = "", []
    for at, chunk in chunks:
        piece = decoder.decode(chunk)
        text += piece
        times += [at] * len(piece)
    events: list[tuple[float, dict[str, object]]] = []
    for match in re.finditer(r"^you: (.*)\nassistant: \s*(\S)?", text, re.MULTILINE):
        events.append((times[match.end(1)], {"segment": match.group(1)}))
        if match.group(2) is not None:
            events.append((times[match.start(2)], {"answer": True}))
    return events


def measure_live(
    utterances: list[Utterance],
    model: str = "default",
    threads: int = 1,
    pause_s: float = 2.0,
    endpoint_silence: float | None = None,
    assist_tokens: int | None = None,
    chunk_ms: int = StreamingOptions.chunk_ms,
) -> dict[str, object]:
    """Play `utterances` into `edgestream transcribe -` at real time (or, with
    `assist_tokens`, into `edgestream assist -`, answers of that many tokens at most); the
    report."""
    endpoint = endpoint_silence or StreamingOptions.silence_after_text_s
    if pause_s < endpoint + 0.3:
        raise ValueError(
            f"--pause must be at least {endpoint + 0.3:.1f} s (an endpoint needs {endpoint}), "
            f"got {pause_s}"
        )
    audio = [read_audio(u.audio) for u in utterances]
    command = [sys.executable, "-m", "edgestream"]
    if assist_tokens is None:
        command += ["transcribe", "-", "--json", "--stream", "--model", model]
    else:
        command += ["assist", "-", "--asr-model", model, "--max-new-tokens", str(assist_tokens)]
    command += ["--threads", str(threads), "--chunk-ms", str(chunk_ms)]
    if endpoint_silence is not None:
        command += ["--endpoint-silence", str(endpoint_silence)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    chunks: list[tuple[float, bytes]] = []
    reader = threading.Thread(target=read_output, args=(process.stdout, chunks))
    reader.start()
    try:
        played = play(process.stdin, audio, pause_s)
    except BrokenPipeError:
        played = []
    reader.join()
    if process.wait() != 0 or not played:
        said = process.stderr.read().decode().strip().splitlines() if process.stderr else []
        # the program under test reports its own bad input (a model name, say): pass it on
        raise ValueError(f"{' '.join(command[3:5])} failed: {said[-1] if said else 'no output'}")
    events = (transcript_events if assist_tokens is None else conversation_events)(chunks)
    report = live_report(utterances, played, events)
    settings = {"model": model, "threads": threads, "pause_s": pause_s, "chunk_ms": chunk_ms}
    return {**settings, "endpoint_silence_s": endpoint, **report}


def live_report(
    utterances: list[Utterance],
    played: list[Played],
    events: list[tuple[float, dict[str, object]]],
) -> dict[str, object]:
    """Per utterance, as delays in seconds: the first segment printed after its speech ended
    (and before the next one's did), the first partial after its speech began, and the first
    answer text after its speech ended, where there are answers."""
    segments = [(at, event) for at, event in events if "segment" in event]
    partials = [at for at, event in events if event.get("partial")]
    answers = [at for at, event in events if "answer" in event]

    def first(times: list[float], after: float, until: float) -> float | None:
        found = next((at for at in times if after < at <= until), None)
        return None if found is None else round(found - after, 3)

    def heard_offsets(speech: Played, until: float) -> dict[str, float]:
        """Where the recognizer says the utterance's segment was heard, against where its
        speech is (seconds; positive: later), when the segment says (transcribe's JSON)."""
        found = next((e for at, e in segments if speech.end < at <= until and "start" in e), None)
        if found is None:
            return {}
        return {
            "start_offset_s": round(float(found["start"]) - speech.speech_at[0], 3),
            "end_offset_s": round(float(found["end"]) - speech.speech_at[1], 3),
        }

    rows = []
    for index, (utterance, speech) in enumerate(zip(utterances, played, strict=True)):
        until = played[index + 1].end if index + 1 < len(played) else float("inf")
        row: dict[str, object] = {
            "audio": str(utterance.audio),
            "speech_s": round(speech.end - speech.start, 2),
            "segment_delay_s": first([at for at, _ in segments], speech.end, until),
            "first_words_s": first(partials, speech.start, until),
            **heard_offsets(speech, until),
        }
        if answers:
            row["answer_delay_s"] = first(answers, speech.end, until)
        rows.append(row)
    heard = " ".join(str(event["segment"]) for _, event in events if "segment" in event)
    reference = normalize_text(" ".join(u.text for u in utterances))
    rtf = [event["rtf"] for _, event in events if "rtf" in event]
    report: dict[str, object] = {
        "utterances": len(utterances),
        "segments": len(segments),
        "wer": float(jiwer.wer(reference, normalize_text(heard))),
        "rtf": rtf[-1] if rtf else None,
    }
    keys = ("segment_delay_s", "first_words_s", "answer_delay_s", "start_offset_s", "end_offset_s")
    for key in keys:
        report[key] = _summary([r[key] for r in rows if r.get(key) is not None])
    return {**report, "rows": rows}


def _summary(values: list[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {
        "mean": round(statistics.fmean(values), 3),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "count": len(values),
    }
