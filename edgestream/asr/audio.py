"""Reading user audio: any soundfile format, rate and channel count, streamed in blocks.

Audio is read a block at a time, downmixed to mono and resampled to 16 kHz by a streaming
`soxr` resampler, so an hour-long file costs the memory of one block. The path `-` reads
standard input as it arrives: a WAV (or OGG) stream piped from a recorder, with no length
known in advance (libsndfile reads such headers from a pipe). Whatever cannot be
transcribed faithfully is refused with an `AudioError` (a ValueError) that names the file and
the problem: a missing, empty, truncated or corrupt file, an unsupported format, or samples
that are not finite numbers. Clipped audio is transcribed as it is; `AudioStats` reports the
clipped fraction so callers can warn.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from edgestream.asr.streaming import MAX_PEAK

SAMPLE_RATE = 16_000
STDIN = "-"  # as a path: the audio arrives on standard input
PIPE_EXAMPLE = "arecord -f S16_LE -r 16000 | edgestream transcribe -"
# What libsndfile decodes correctly from a pipe, checked one by one; MP3 opens but decodes
# into noise there, and FLAC does not open.
PIPE_FORMATS = ("WAV", "WAVEX", "RF64", "W64", "AU", "OGG")
CLIP_LEVEL = 0.999  # samples at or above this magnitude count as clipped


class AudioError(ValueError):
    """Audio that cannot be transcribed, with the reason."""


@dataclass
class AudioStats:
    """What was read: original rate and channels, seconds, and the clipped sample fraction."""

    sample_rate: int
    channels: int
    seconds: float = 0.0
    clipped_fraction: float = 0.0
    truncated: bool = False  # a WAV whose data chunk claims more bytes than the file holds
    _clipped: int = 0
    _samples: int = 0


def _wav_is_truncated(path: Path) -> bool:
    """True when a RIFF/WAVE file's `data` chunk claims more bytes than follow it (libsndfile
    then quietly reads what is there)."""
    with path.open("rb") as handle:
        header = handle.read(12)
        if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            return False
        size = path.stat().st_size
        while True:
            chunk = handle.read(8)
            if len(chunk) < 8:
                return False
            length = int.from_bytes(chunk[4:], "little")
            if chunk[:4] == b"data":
                return length != 0xFFFFFFFF and handle.tell() + length > size
            handle.seek(length + (length & 1), 1)


def open_audio(path: str | Path) -> sf.SoundFile:
    """Open `path` for reading, or raise AudioError saying why it cannot be."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a folder, expected an audio file")
    if path.stat().st_size == 0:
        raise AudioError(f"{path}: the file is empty")
    try:
        handle = sf.SoundFile(str(path))
    except sf.LibsndfileError as error:
        raise AudioError(
            f"{path}: not a readable audio file ({error.error_string}); expected WAV, FLAC or OGG"
        ) from None
    if handle.frames == 0:
        handle.close()
        raise AudioError(f"{path}: the file holds no audio samples")
    return handle


def open_stdin() -> sf.SoundFile:
    """Open standard input as an audio stream, or raise AudioError saying why it cannot be."""
    if sys.stdin is None or sys.stdin.isatty():
        raise AudioError(f"standard input is not a pipe: send audio into it, e.g. {PIPE_EXAMPLE}")
    try:
        source: int | io.BufferedIOBase = sys.stdin.fileno()
    except (AttributeError, io.UnsupportedOperation):  # replaced by an in-memory file
        source = sys.stdin.buffer
    try:
        # closefd=False: standard input stays open for whoever reads it after us
        handle = sf.SoundFile(source, closefd=False)
    except sf.LibsndfileError as error:
        raise AudioError(
            f"standard input: not an audio stream ({error.error_string}); pipe WAV into it "
            f"(arecord, `sox ... -t wav -`, `ffmpeg ... -f wav -`), e.g. {PIPE_EXAMPLE}"
        ) from None
    if handle.format not in PIPE_FORMATS:
        handle.close()
        raise AudioError(
            f"standard input: {handle.format} cannot be decoded from a pipe (libsndfile "
            f"decodes it wrongly there); pipe WAV or OGG, or give the file's path"
        )
    if handle.frames == 0:
        handle.close()
        # A writer that cannot seek back must say "length unknown" (0xFFFFFFFF), as arecord,
        # sox and ffmpeg do; a header left at 0 reads as empty, whatever follows it.
        raise AudioError(
            "standard input: the stream's header says it holds no audio samples "
            "(a WAV stream of unknown length must give 0xFFFFFFFF as its data size)"
        )
    return handle


def stream_audio(
    path: str | Path, block_seconds: float = 0.5, stats: AudioStats | None = None
) -> Iterator[np.ndarray]:
    """Yield float32 mono 16 kHz blocks of `path` (`-`: standard input); fills `stats` as it
    goes.

    Raises AudioError for NaN or infinite samples, float samples far past full scale and for
    undecodable data. A truncated WAV is read as far as it goes, and flagged in `stats`.
    Standard input is read until it ends, so a live stream yields each block as soon as the
    recorder has written it."""
    live = str(path) == STDIN
    name = "standard input" if live else str(path)
    with open_stdin() if live else open_audio(path) as handle:
        rate, channels, expected = handle.samplerate, handle.channels, handle.frames
        if stats is not None:
            stats.sample_rate, stats.channels = rate, channels
            stats.truncated = not live and _wav_is_truncated(Path(path))
        resampler = (
            soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
            if rate != SAMPLE_RATE
            else None
        )
        read = 0
        block = max(1, int(rate * block_seconds))
        while True:
            try:
                samples = handle.read(block, dtype="float32", always_2d=True)
            except sf.LibsndfileError as error:
                raise AudioError(f"{name}: corrupt audio data ({error.error_string})") from None
            last = len(samples) < block
            read += len(samples)
            mono = samples.mean(axis=1, dtype=np.float32) if channels > 1 else samples[:, 0]
            if not np.all(np.isfinite(mono)):
                raise AudioError(f"{name}: holds NaN or infinite samples near {read / rate:.1f} s")
            peak = float(np.abs(mono).max()) if len(mono) else 0.0
            if peak > MAX_PEAK:  # a float file scaled wrongly: its sound would be mostly clipping
                raise AudioError(
                    f"{name}: float samples reach {peak:g} near {read / rate:.1f} s, far past "
                    "full scale (1.0); normalise the file first"
                )
            if stats is not None:
                stats._samples += len(mono)
                stats._clipped += int(np.count_nonzero(np.abs(mono) >= CLIP_LEVEL))
                stats.seconds = stats._samples / rate
                stats.clipped_fraction = stats._clipped / max(1, stats._samples)
            out = resampler.resample_chunk(mono, last=last) if resampler is not None else mono
            if len(out):
                yield out
            if last:
                break
        if read < expected and stats is not None and not live:
            stats.truncated = True
        if read == 0:
            raise AudioError(f"{name}: holds no audio samples")


def read_audio(path: str | Path) -> np.ndarray:
    """The whole of `path` as float32 mono 16 kHz (for short files; stream long ones)."""
    blocks = list(stream_audio(path))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
