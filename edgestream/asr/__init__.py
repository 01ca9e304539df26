"""Streaming Conformer-CTC speech recognition: corpus synthesis, model, recognizer, training.

The names below are the library's front door (docs/python-api.md), imported on first use so
that the onnxruntime path can run without PyTorch:

    from edgestream.asr import Recognizer, load_streaming_model, read_audio, recommended_options

    asr = load_streaming_model("default")  # the bundled model; or a .safetensors / .onnx file
    recognizer = Recognizer(asr, recommended_options())  # beam search + the bundled word LM
    recognizer.accept_waveform(read_audio("question.wav"))  # 16 kHz mono float32, any length
    print(recognizer.text)  # partial result so far
    print(recognizer.finalize())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgestream.lazy_exports import lazy_exports

_EXPORTS = {
    "load_streaming_model": "edgestream.asr.backends",
    "Recognizer": "edgestream.asr.streaming",
    "StreamingOptions": "edgestream.asr.streaming",
    "recommended_options": "edgestream.asr.streaming",
    "Segment": "edgestream.asr.streaming",
    "read_audio": "edgestream.asr.audio",
    "AudioError": "edgestream.asr.audio",
    "SAMPLE_RATE": "edgestream.asr.audio",
    "transcribe_file": "edgestream.asr.transcribe",
    "interrupt_stops": "edgestream.asr.transcribe",
    "Transcript": "edgestream.asr.transcribe",
}

if TYPE_CHECKING:
    from edgestream.asr.audio import SAMPLE_RATE, AudioError, read_audio
    from edgestream.asr.backends import load_streaming_model
    from edgestream.asr.streaming import (
        Recognizer,
        Segment,
        StreamingOptions,
        recommended_options,
    )
    from edgestream.asr.transcribe import Transcript, interrupt_stops, transcribe_file

__all__ = [
    "SAMPLE_RATE",
    "AudioError",
    "Recognizer",
    "Segment",
    "StreamingOptions",
    "Transcript",
    "interrupt_stops",
    "load_streaming_model",
    "read_audio",
    "recommended_options",
    "transcribe_file",
]  # the keys of _EXPORTS


__getattr__ = lazy_exports(__name__, _EXPORTS)
