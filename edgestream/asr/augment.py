"""Audio augmentation for the synthetic corpus: speed, padding, room reverberation, noise
(white, pink, brown or babble) at a drawn SNR, and gain, all drawn per utterance from a seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import soxr

from edgestream.asr.voices import Espeak, EspeakVoice

SAMPLE_RATE = 16_000
NOISE_KINDS = ("white", "pink", "brown", "babble")


@dataclass(frozen=True)
class Augment:
    """Everything drawn for one utterance's augmentation."""

    speed: float
    rt60_s: float  # 0: no reverberation
    drr_db: float
    noise: str  # one of NOISE_KINDS
    snr_db: float
    level_dbfs: float
    pad_start_s: float
    pad_end_s: float
    seed: int  # noise samples and room impulse response
    babble: tuple[tuple[str, EspeakVoice], ...] = ()  # (text, voice) talkers, for "babble"


def room_impulse_response(rt60_s: float, drr_db: float, rng: np.random.Generator) -> np.ndarray:
    """Synthetic room: a unit direct path, then exponentially decaying Gaussian noise (the late
    reverberation of a diffuse field) after a 1-5 ms gap, scaled to the direct-to-reverberant
    ratio. Returns float32 (taps,) at 16 kHz, about 1.2 * rt60 long."""
    taps = max(int(1.2 * rt60_s * SAMPLE_RATE), 2)
    gap = int(rng.uniform(0.001, 0.005) * SAMPLE_RATE)
    t = np.arange(taps - gap) / SAMPLE_RATE
    tail = rng.standard_normal(taps - gap) * np.exp(-3.0 * math.log(10.0) * t / rt60_s)  # -60 dB
    tail *= math.sqrt(10.0 ** (-drr_db / 10.0) / max(float(np.sum(tail**2)), 1e-12))
    response = np.zeros(taps)
    response[0] = 1.0
    response[gap:] += tail
    return response.astype(np.float32)


def _fft_size(length: int) -> int:
    """The power of two >= length: numpy's FFT is several times slower on large primes."""
    return 1 << max(length - 1, 0).bit_length()


def colored_noise(kind: str, length: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-power noise, float32 (length,): white, pink (1/f power) or brown (1/f^2)."""
    exponents = {"white": 0.0, "pink": 0.5, "brown": 1.0}
    if kind not in exponents:
        raise ValueError(f"unknown noise {kind!r}: expected one of {', '.join(exponents)}")
    if kind == "white":
        noise = rng.standard_normal(length)
    else:
        size = _fft_size(length)
        spectrum = np.fft.rfft(rng.standard_normal(size))
        frequencies = np.maximum(np.fft.rfftfreq(size), 1.0 / size)  # no 1/0 at DC
        noise = np.fft.irfft(spectrum / frequencies ** exponents[kind], n=size)[:length]
    return (noise / max(float(np.sqrt(np.mean(noise**2))), 1e-12)).astype(np.float32)


def _to_16k(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Resample to 16 kHz; reading the input as if recorded at rate * speed perturbs speed."""
    return soxr.resample(samples, sample_rate * speed, SAMPLE_RATE).astype(np.float32)


def _babble(
    talkers: Sequence[tuple[str, EspeakVoice]],
    length: int,
    espeak: Espeak,
    rng: np.random.Generator,
) -> np.ndarray:
    """Unit-power sum of other utterances, each looped and randomly shifted, (length,)."""
    mix = np.zeros(length, np.float32)
    for text, voice in talkers:
        speech = _to_16k(espeak.synthesize(text, voice), espeak.sample_rate, 1.0)
        speech /= max(float(np.sqrt(np.mean(speech**2))), 1e-9)
        mix += np.roll(np.resize(speech, length), int(rng.integers(length)))
    return mix / max(float(np.sqrt(np.mean(mix**2))), 1e-9)


def augment_speech(
    speech: np.ndarray, sample_rate: int, augment: Augment, espeak: Espeak | None
) -> np.ndarray:
    """Clean TTS output -> the corpus waveform: speed and resampling to 16 kHz, silence padding,
    room reverberation, noise at the drawn SNR (relative to the speech power), gain to the drawn
    level and a peak limit at 0.99. Returns float32 (samples,) at 16 kHz. `espeak` is needed
    only for babble noise."""
    rng = np.random.default_rng(augment.seed)
    voiced = _to_16k(speech, sample_rate, augment.speed)
    start, end = int(augment.pad_start_s * SAMPLE_RATE), int(augment.pad_end_s * SAMPLE_RATE)
    signal = np.concatenate([np.zeros(start, np.float32), voiced, np.zeros(end, np.float32)])
    if augment.rt60_s > 0:
        response = room_impulse_response(augment.rt60_s, augment.drr_db, rng)
        size = _fft_size(len(signal) + len(response) - 1)  # linear, not circular, convolution
        wet = np.fft.irfft(np.fft.rfft(signal, size) * np.fft.rfft(response, size), size)
        signal = wet[: len(signal)].astype(np.float32)  # the tail rings into the end padding
    speech_power = max(float(np.mean(signal[start : len(signal) - end] ** 2)), 1e-12)
    if augment.noise == "babble":
        if espeak is None:
            raise ValueError("babble noise needs an Espeak engine, got None")
        noise = _babble(augment.babble, len(signal), espeak, rng)
    else:
        noise = colored_noise(augment.noise, len(signal), rng)
    noisy = signal + noise * math.sqrt(speech_power / 10.0 ** (augment.snr_db / 10.0))
    noisy *= 10.0 ** (augment.level_dbfs / 20.0) / math.sqrt(speech_power)
    peak = float(np.max(np.abs(noisy)))
    return noisy * (0.99 / peak) if peak > 0.99 else noisy
