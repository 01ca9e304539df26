"""Streaming fbank equals the one-shot computation exactly; CMVN estimates and round-trips."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from edgestream.asr.features import (
    NUM_MEL_BINS,
    SAMPLE_RATE,
    GlobalCmvn,
    StreamingFbank,
    compute_fbank,
    dither,
    num_frames,
)


def _signal(samples: int, seed: int) -> np.ndarray:
    """Speech-like test signal: a gliding tone plus noise, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)
    return (tone + 0.05 * rng.standard_normal(samples)).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(
    samples=st.integers(0, 6000),
    cuts=st.lists(st.integers(0, 6000), max_size=12),
    seed=st.integers(0, 2**16),
)
def test_streaming_equals_one_shot_exactly(samples: int, cuts: list[int], seed: int) -> None:
    signal = _signal(samples, seed)
    offline = compute_fbank(signal)
    assert offline.shape == (num_frames(samples), NUM_MEL_BINS) and offline.dtype == np.float32
    stream = StreamingFbank()
    bounds = [0, *sorted(c for c in cuts if c <= samples), samples]  # empty pieces included
    pieces = [stream.accept_waveform(signal[a:b]) for a, b in itertools.pairwise(bounds)]
    streamed = np.concatenate(pieces) if pieces else np.zeros((0, NUM_MEL_BINS), np.float32)
    assert np.array_equal(streamed, offline)
    assert stream.frames_emitted == len(offline)


def test_frame_count_and_timing() -> None:
    assert [num_frames(n) for n in (0, 399, 400, 559, 560, 16_000)] == [0, 0, 1, 1, 2, 98]
    stream = StreamingFbank()
    assert len(stream.accept_waveform(np.zeros(399, np.float32))) == 0
    assert len(stream.accept_waveform(np.zeros(1, np.float32))) == 1  # the 400th sample
    assert len(stream.accept_waveform(np.zeros(159, np.float32))) == 0
    assert len(stream.accept_waveform(np.zeros(1, np.float32))) == 1  # 160 samples later


def _reference_fbank(signal: np.ndarray) -> np.ndarray:
    """Kaldi's fbank written out in numpy (float64), independent of kaldi-native-fbank."""
    count = num_frames(len(signal))
    scaled = signal * 32768.0 + dither(0, len(signal))
    frames = np.stack([scaled[i * 160 : i * 160 + 400] for i in range(count)])
    frames = frames.astype(np.float64) - frames.mean(axis=1, keepdims=True)  # (T, 400)
    frames = np.concatenate(  # pre-emphasis; the first sample against itself
        [frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1
    )
    frames *= (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 399)) ** 0.85  # Povey window
    power = np.abs(np.fft.rfft(frames, 512)) ** 2  # (T, 257)

    def mel(hz: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(hz) / 700.0)

    # 80 triangles on 82 points evenly spaced in mel from 20 Hz to Nyquist (Nyquist bin unused).
    low, step = mel(20.0), (mel(8000.0) - mel(20.0)) / (NUM_MEL_BINS + 1)
    bin_mel = mel(np.arange(256) * SAMPLE_RATE / 512)
    banks = np.zeros((NUM_MEL_BINS, 257))
    for i in range(NUM_MEL_BINS):
        left, centre, right = low + i * step, low + (i + 1) * step, low + (i + 2) * step
        rise, fall = (bin_mel - left) / (centre - left), (right - bin_mel) / (right - centre)
        banks[i, :256] = np.where((bin_mel > left) & (bin_mel < right), np.minimum(rise, fall), 0)
    return np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps))  # (T, 80)


def test_features_match_an_independent_kaldi_fbank() -> None:
    for seed, samples in ((0, 400), (1, 8000), (2, 12_345)):
        signal = _signal(samples, seed)
        assert np.allclose(compute_fbank(signal), _reference_fbank(signal), atol=1e-3)


def test_bad_input_is_refused() -> None:
    stream = StreamingFbank()
    with pytest.raises(ValueError, match="shape"):
        stream.accept_waveform(np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="float"):
        stream.accept_waveform(np.zeros(100, np.int16))


def test_cmvn_estimates_normalizes_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((n, NUM_MEL_BINS)) * 3 + 7).astype(np.float32) for n in (500, 1200, 3)
    ]
    cmvn = GlobalCmvn.from_features(batches)
    assert cmvn.frames == 1703
    normalized = cmvn.normalize(np.concatenate(batches))
    assert np.allclose(normalized.mean(axis=0), 0, atol=1e-4)
    assert np.allclose(normalized.std(axis=0), 1, atol=1e-3)
    path = tmp_path / "cmvn.json"
    cmvn.save(path)
    loaded = GlobalCmvn.load(path)
    assert np.array_equal(loaded.mean, cmvn.mean) and np.array_equal(loaded.std, cmvn.std)
    assert loaded.mean.dtype == np.float32 and loaded.frames == cmvn.frames
    with pytest.raises(ValueError, match="missing"):
        GlobalCmvn.from_dict({"mean": [0.0] * NUM_MEL_BINS})
    with pytest.raises(ValueError, match="shape"):
        GlobalCmvn(np.zeros(3, np.float32), np.ones(3, np.float32), 1)
    with pytest.raises(FileNotFoundError):
        GlobalCmvn.load(tmp_path / "absent.json")


def test_cmvn_from_manifest_matches_features(tmp_path: Path) -> None:
    signals = [_signal(8000, 1), _signal(12_345, 2)]
    with (tmp_path / "train.jsonl").open("w") as manifest:
        for index, signal in enumerate(signals):
            (tmp_path / "audio").mkdir(exist_ok=True)
            sf.write(tmp_path / "audio" / f"{index}.wav", signal, SAMPLE_RATE, subtype="FLOAT")
            manifest.write(json.dumps({"audio": f"audio/{index}.wav", "text": "a b c"}) + "\n")
    from_manifest = GlobalCmvn.from_manifest(tmp_path / "train.jsonl")
    expected = GlobalCmvn.from_features(compute_fbank(s) for s in signals)
    assert np.array_equal(from_manifest.mean, expected.mean)
    assert from_manifest.frames == num_frames(8000) + num_frames(12_345)


def test_digital_silence_is_dithered_like_quiet_noise() -> None:
    """Zeros must not hit the log floor (-15.9): the model never heard that in training."""
    silence = compute_fbank(np.zeros(16_000, np.float32))
    assert silence.min() > -10 and 0 < silence.mean() < 6
    assert np.array_equal(silence, compute_fbank(np.zeros(16_000, np.float32)))  # deterministic
