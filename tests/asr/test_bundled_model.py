"""The bundled default recognizer: it loads by name, streams exactly like its offline pass on
the bundled sample, and transcribes that sample."""

from __future__ import annotations

from pathlib import Path

import jiwer
import torch

from edgestream.asr.audio import read_audio
from edgestream.asr.decode import ctc_greedy
from edgestream.asr.features import compute_fbank
from edgestream.asr.lm import load_lm
from edgestream.asr.model_io import BUNDLED, load_model
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.transcribe import transcribe_samples

SAMPLE = Path(__file__).parents[2] / "edgestream/asr/samples/why-is-the-sky-blue.wav"


def test_bundled_model_is_small_and_documented() -> None:
    path = BUNDLED["default"]
    assert path.stat().st_size < 40 * 2**20
    assert (path.parent / "README.md").read_text().count(path.name) >= 1
    asr = load_model("default")
    assert asr.info["history"], "the card's numbers come from the training history"


def test_bundled_model_streams_like_its_offline_pass_and_hears_the_sample() -> None:
    asr = load_model("default")
    samples = read_audio(SAMPLE)
    for chunk_ms in (160, 640):
        options = StreamingOptions(chunk_ms=chunk_ms)
        features = torch.from_numpy(asr.cmvn.normalize(compute_fbank(samples)))[None]
        with torch.no_grad():
            log_probs, _ = asr.model(
                features, torch.tensor([features.shape[1]]), options.chunk_frames, 4
            )
        offline = asr.vocabulary.decode(ctc_greedy(log_probs[0].numpy()))
        streamed = transcribe_samples(asr, samples, options)
        assert streamed == offline
    assert jiwer.cer("why is the sky blue", streamed) < 0.35, streamed


def test_the_bundled_word_lm_repairs_the_bundled_sample() -> None:
    """Greedy decoding hears a near miss; the default decoding (beam 16 and the bundled
    trigram) gets every word."""
    asr, samples = load_model("default"), read_audio(SAMPLE)
    greedy = transcribe_samples(asr, samples, StreamingOptions())
    default = transcribe_samples(asr, samples, StreamingOptions(beam=16, lm=load_lm("default")))
    assert default == "why is the sky blue" != greedy
