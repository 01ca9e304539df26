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
from edgestream.asr.manifest import read_manifest
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


def test_the_bundled_word_lm_lowers_the_word_error_rate(tiny_corpus: Path) -> None:
    """On freshly synthesised speech (eSpeak, augmented, the tiny test corpus), the default
    decoding (beam 16 and the bundled trigram) makes fewer word errors than greedy."""
    asr = load_model("default")
    with_lm = StreamingOptions(beam=16, lm=load_lm("default"))
    references, greedy, fused = [], [], []
    for split in ("train", "dev", "test"):
        for entry in read_manifest(tiny_corpus / f"{split}.jsonl"):
            samples = read_audio(tiny_corpus / entry.audio)
            references.append(entry.text)
            greedy.append(transcribe_samples(asr, samples, StreamingOptions()))
            fused.append(transcribe_samples(asr, samples, with_lm))
    assert len(references) >= 8
    assert jiwer.wer(references, fused) < jiwer.wer(references, greedy)
