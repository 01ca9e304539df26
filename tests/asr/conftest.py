"""ASR fixtures: a tiny eSpeak corpus and tiny Conformer-CTC models (random and briefly trained)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from edgestream.asr.conformer import ConformerConfig, ConformerCTC
from edgestream.asr.decode import CharVocabulary
from edgestream.asr.features import GlobalCmvn
from edgestream.asr.model_io import save_model
from edgestream.asr.synth import SynthConfig, synthesize_corpus
from edgestream.asr.text import SentenceSplits
from edgestream.asr.voices import espeak_available

needs_espeak = pytest.mark.skipif(
    not espeak_available(), reason="eSpeak NG missing: pip install espeakng-loader"
)

SAMPLE = Path(__file__).parents[2] / "edgestream/asr/samples/why-is-the-sky-blue.wav"

TINY = ConformerConfig(d_model=32, num_heads=2, num_layers=2, subsampling_channels=16, dropout=0.0)

WORDS = ("cat", "dog", "bird", "fish")
NUMBERS = ("one", "two", "three", "four")
TINY_SENTENCES = SentenceSplits(
    train=tuple(f"the {w} sat on mat {n}" for w in WORDS for n in NUMBERS),
    dev=("a dog ran home", "the bird sang a song"),
    test=("we like the mat", "one two three"),
)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 40 s of eSpeak speech (no piper: fast), with train/dev/test manifests."""
    if not espeak_available():
        pytest.skip("eSpeak NG missing: pip install espeakng-loader")
    out = tmp_path_factory.mktemp("corpus")
    config = SynthConfig(piper_fraction=0.0, block_size=8)
    synthesize_corpus(out, hours=0.01, sentences=TINY_SENTENCES, config=config, workers=2)
    return out


def random_model_file(path: Path, seed: int = 0, config: ConformerConfig = TINY) -> Path:
    """An untrained model: its outputs are arbitrary but deterministic, non-blank characters,
    which makes streaming-versus-offline comparisons strict."""
    torch.manual_seed(seed)
    model = ConformerCTC(config).eval()
    cmvn = GlobalCmvn(torch.full((80,), 10.0).numpy(), torch.full((80,), 3.0).numpy(), 1)
    save_model(path, model, cmvn, CharVocabulary(), {"note": "random weights, for tests"})
    return path


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_model_file(tmp_path_factory.mktemp("models") / "random.safetensors")


def wav_stream(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    """`samples` as a recorder writes WAV into a pipe: sizes unknown (0xFFFFFFFF)."""
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype=subtype)
    data = bytearray(buffer.getvalue())
    data[4:8] = b"\xff\xff\xff\xff"
    at = data.index(b"data")
    data[at + 4 : at + 8] = b"\xff\xff\xff\xff"
    return bytes(data)
