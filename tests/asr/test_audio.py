from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from edgestream.asr.audio import AudioError, AudioStats, read_audio, stream_audio
from tests.asr.conftest import wav_stream


def _tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize(
    ("suffix", "rate", "channels"),
    [
        ("wav", 16_000, 1),
        ("wav", 8_000, 1),
        ("wav", 44_100, 2),
        ("flac", 22_050, 2),
        ("ogg", 48_000, 1),
    ],
)
def test_any_format_rate_and_channels_become_16k_mono(
    tmp_path: Path, suffix: str, rate: int, channels: int
) -> None:
    tone = _tone(1.5, rate)
    path = tmp_path / f"a.{suffix}"
    sf.write(path, np.stack([tone] * channels, axis=1), rate)
    stats = AudioStats(0, 0)
    samples = np.concatenate(list(stream_audio(path, stats=stats)))
    assert (stats.sample_rate, stats.channels) == (rate, channels)
    assert samples.dtype == np.float32 and len(samples) == pytest.approx(24_000, abs=40)
    spectrum = np.abs(np.fft.rfft(samples[2000:-2000]))
    assert np.argmax(spectrum) * 16_000 / len(samples[2000:-2000]) == pytest.approx(440, abs=3)


def test_bad_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.touch()
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio " * 50)
    headless = tmp_path / "zero.wav"
    sf.write(headless, np.zeros(0, np.float32), 16_000)
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.array([0.1, np.nan, 0.2] * 100, np.float32), 16_000, subtype="FLOAT")
    loud = tmp_path / "loud.wav"  # float samples scaled as 16-bit integers
    sf.write(loud, 3000 * _tone(0.5, 16_000), 16_000, subtype="FLOAT")
    for path, reason in [
        (tmp_path / "missing.wav", "no such file"),
        (tmp_path, "folder"),
        (empty, "empty"),
        (text, "not a readable audio file"),
        (headless, "no audio samples"),
        (nan, "NaN"),
        (loud, "far past full scale"),
    ]:
        with pytest.raises(AudioError, match=reason):
            read_audio(path)


def test_truncated_and_clipped_files_are_read_and_flagged(tmp_path: Path) -> None:
    whole = tmp_path / "whole.wav"
    sf.write(whole, np.clip(3 * _tone(2.0, 16_000), -1, 1), 16_000)
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(whole.read_bytes()[:40_000])
    stats = AudioStats(0, 0)
    samples = np.concatenate(list(stream_audio(truncated, stats=stats)))
    assert stats.truncated and len(samples) == (40_000 - 44) // 2
    assert stats.clipped_fraction > 0.3
    whole_stats = AudioStats(0, 0)
    list(stream_audio(whole, stats=whole_stats))
    assert not whole_stats.truncated


def test_long_files_are_read_in_small_blocks(tmp_path: Path) -> None:
    path = tmp_path / "long.flac"
    sf.write(path, _tone(120.0, 44_100), 44_100)
    sizes = [len(block) for block in stream_audio(path)]
    assert sum(sizes) == pytest.approx(120 * 16_000, abs=40)
    assert max(sizes) <= 16_000  # half a second at a time: memory does not grow with length


def _stdin_holding(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_standard_input_streams_a_wav_of_unknown_length(monkeypatch: pytest.MonkeyPatch) -> None:
    tone = _tone(1.5, 44_100)
    _stdin_holding(monkeypatch, wav_stream(np.stack([tone, tone], axis=1), 44_100, "FLOAT"))
    stats = AudioStats(0, 0)
    blocks = list(stream_audio("-", 0.1, stats))
    assert (stats.sample_rate, stats.channels, stats.truncated) == (44_100, 2, False)
    assert max(len(block) for block in blocks) <= 1_700  # 0.1 s blocks: live latency
    samples = np.concatenate(blocks)
    file_samples = soxr.resample(tone, 44_100, 16_000)
    assert len(samples) == pytest.approx(len(file_samples), abs=40)
    assert np.abs(samples[2000:-2000] - file_samples[2000:-2000]).max() < 1e-3


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not an audio stream"),
        (b"hello, not audio " * 20, "not an audio stream"),
        (wav_stream(np.zeros(1600, np.float32), 16_000)[:30], "not an audio stream"),
    ],
)
def test_bad_standard_input_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, data: bytes, reason: str
) -> None:
    _stdin_holding(monkeypatch, data)
    with pytest.raises(AudioError, match=f"standard input: {reason}"):
        read_audio("-")


def test_mp3_on_standard_input_is_refused_not_decoded_into_noise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buffer = io.BytesIO()
    sf.write(buffer, _tone(1.0, 16_000), 16_000, format="MP3")
    _stdin_holding(monkeypatch, buffer.getvalue())
    with pytest.raises(AudioError, match="MP3 cannot be decoded from a pipe"):
        read_audio("-")


def test_a_wav_stream_whose_header_claims_no_samples_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = bytearray(wav_stream(_tone(0.5, 16_000), 16_000))
    at = data.index(b"data")
    data[at + 4 : at + 8] = bytes(4)  # a writer that meant to seek back and fill it in
    _stdin_holding(monkeypatch, bytes(data))
    with pytest.raises(AudioError, match="0xFFFFFFFF"):
        read_audio("-")


def test_a_terminal_is_not_taken_for_audio(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    with pytest.raises(AudioError, match=r"not a pipe.*arecord"):
        read_audio("-")
