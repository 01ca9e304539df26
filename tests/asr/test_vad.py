"""Silero VAD endpointing: the real model from the silero-vad package, run by onnxruntime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from edgestream.asr import vad as vad_module
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import Recognizer, StreamingOptions
from edgestream.cli import app

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("silero_vad") is None,
    reason="silero-vad is not installed (pip install silero-vad)",
)
SAMPLE = Path(vad_module.__file__).parent / "samples" / "why-is-the-sky-blue.wav"


def _speech_gap_speech(gap_s: float) -> np.ndarray:
    speech = sf.read(SAMPLE, dtype="float32")[0]
    gap = np.zeros(int(gap_s * 16_000), np.float32)
    return np.concatenate([gap[:8000], speech, gap, speech, gap[:8000]])


def test_speech_probabilities_find_the_speech_whatever_the_pieces() -> None:
    vad = vad_module.SileroVad()
    audio = _speech_gap_speech(2.0)
    whole = vad.stream().accept(audio)
    assert len(whole) == len(audio) // vad_module.WINDOW
    stream = vad.stream()
    pieces = [stream.accept(audio[i : i + 777]) for i in range(0, len(audio), 777)]
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-6)
    speech = whole >= vad.threshold
    window_s = vad_module.WINDOW / 16_000
    assert not speech[: int(0.4 / window_s)].any()  # the leading half second of silence
    gap = slice(int(3.0 / window_s), int(4.0 / window_s))  # inside the two-second gap
    assert speech.mean() > 0.3 and not speech[gap].any()


def test_vad_endpoints_split_where_ctc_blanks_never_would(random_model: Path) -> None:
    """The random test model emits a character on almost every frame, so the blank rule never
    ends a segment; the VAD's silence does, once the gap has lasted `silence_after_text_s`."""
    asr, audio = load_model(random_model), _speech_gap_speech(2.0)
    gap_start = 0.5 + sf.info(SAMPLE).duration

    def first_endpoint_s(options: StreamingOptions) -> float | None:
        recognizer = Recognizer(asr, options)
        for start in range(0, len(audio), 1600):
            recognizer.accept_waveform(audio[start : start + 1600])
            if recognizer.segments:
                return (start + 1600) / 16_000
        return None

    options = StreamingOptions(vad=vad_module.SileroVad())
    assert first_endpoint_s(StreamingOptions()) is None
    endpoint = first_endpoint_s(options)
    assert endpoint is not None
    # Due after 1.2 s of silence; seen when the chunk holding that moment has been encoded.
    due = gap_start + options.silence_after_text_s
    assert due - 0.1 <= endpoint <= due + options.chunk_ms / 1000 + 0.3


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install silero-vad"):
        vad_module.SileroVad()
    refused = CliRunner().invoke(app, ["transcribe", str(SAMPLE), "--vad"])
    assert refused.exit_code == 2 and "pip install silero-vad" in refused.stderr
    with pytest.raises(ValueError, match="threshold"):
        vad_module.SileroVad(threshold=1.5)
