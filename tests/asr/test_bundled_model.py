"""The bundled default recognizer: it loads by name, streams exactly like its offline pass on
the bundled sample, and transcribes that sample."""

from __future__ import annotations

from pathlib import Path

import jiwer
import pytest
import torch

from edgestream.asr.audio import read_audio
from edgestream.asr.decode import ctc_greedy
from edgestream.asr.features import compute_fbank
from edgestream.asr.lm import load_lm
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import BUNDLED, load_model
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.synth import SynthConfig, synthesize_corpus
from edgestream.asr.text import SentenceSplits
from edgestream.asr.transcribe import transcribe_samples
from edgestream.asr.voices import espeak_available
from tests.asr.conftest import SAMPLE


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


# Everyday sentences written for this test (in none of the task text): the kind of speech the
# bundled LM is for. The tiny corpus's "the cat sat on the mat number one" is not: there the
# LM rightly prefers the name "matt", which its text holds far more often than "mat".
EVERYDAY = (
    "can you tell me what time the meeting starts tomorrow",
    "the price of the house was three hundred thousand dollars",
    "she has been working at the hospital for ten years",
    "i would like to book a table for two people tonight",
    "the government announced new plans to build more schools",
    "how many students passed the exam last year",
    "he said that the weather would be better on sunday",
    "we need to buy some bread and milk on the way home",
    "the restaurant serves cheap italian food near the river",
    "what is the name of the city where he was born",
)


@pytest.fixture(scope="module")
def everyday_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not espeak_available():
        pytest.skip("eSpeak NG missing: pip install espeakng-loader")
    out = tmp_path_factory.mktemp("everyday")
    splits = SentenceSplits(train=EVERYDAY[:6], dev=EVERYDAY[6:8], test=EVERYDAY[8:])
    config = SynthConfig(piper_fraction=0.0, block_size=8)
    synthesize_corpus(out, hours=0.02, sentences=splits, config=config, workers=2)
    return out


def test_the_bundled_word_lm_lowers_the_word_error_rate(everyday_corpus: Path) -> None:
    """On freshly synthesised everyday speech (eSpeak, augmented), the default decoding (beam
    16 and the bundled trigram) makes fewer word errors than greedy."""
    asr = load_model("default")
    with_lm = StreamingOptions(beam=16, lm=load_lm("default"))
    references, greedy, fused = [], [], []
    for split in ("train", "dev", "test"):
        for entry in read_manifest(everyday_corpus / f"{split}.jsonl"):
            samples = read_audio(everyday_corpus / entry.audio)
            references.append(entry.text)
            greedy.append(transcribe_samples(asr, samples, StreamingOptions()))
            fused.append(transcribe_samples(asr, samples, with_lm))
    assert len(references) >= 16
    assert jiwer.wer(references, fused) < jiwer.wer(references, greedy)
