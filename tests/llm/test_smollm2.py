"""The real SmolLM2-135M-Instruct: token-for-token parity with transformers, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from edgestream.cli import app
from edgestream.llm.engine import generate_ar
from edgestream.llm.loading import LanguageModel
from edgestream.llm.model import Transformer, can_pack_weights
from tests.conftest import needs_smollm2

pytestmark = needs_smollm2

PROMPTS = [
    ("What is the capital of France?", True),
    ("Write a SQL query that counts the rows of a table named users.", True),
    ("Summarise in one sentence: the meeting moved to Friday because two people were ill.", True),
    ("Give three facts about the Moon.", True),
    ("The three primary colours are", False),
    ("def fibonacci(n):", False),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_hf: tuple[object, object]) -> LanguageModel:
    hf_model, tokenizer = smollm2_hf
    model = Transformer.from_hf(hf_model)
    if can_pack_weights():
        model.pack_weights()  # the engine as users run it
    return LanguageModel(model, tokenizer, "smollm2")


@pytest.mark.parametrize(("prompt", "chat"), PROMPTS)
def test_greedy_equals_transformers_token_for_token(
    smollm2: LanguageModel, smollm2_hf: tuple[object, object], prompt: str, chat: bool
) -> None:
    hf_model, _ = smollm2_hf
    ids = smollm2.encode_prompt(prompt, chat)
    inputs = torch.tensor([ids])
    expected = hf_model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=2,
        pad_token_id=2,
    )[0, len(ids) :].tolist()
    result = generate_ar(smollm2.model, ids, 40, smollm2.stop_ids)
    assert result.token_ids == expected


def test_cli_answers_the_capital_of_france() -> None:
    result = CliRunner().invoke(app, ["generate", "What is the capital of France?", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert "Paris" in record["text"]
    assert (
        record["token_ids"][-1] == 2 and record["method"] == "ar" and record["model"] == "smollm2"
    )


def test_bfloat16_answers_coherently() -> None:
    result = CliRunner().invoke(
        app, ["generate", "What is the capital of France?", "--json", "--dtype", "bfloat16"]
    )
    assert result.exit_code == 0, result.output
    assert "Paris" in json.loads(result.stdout)["text"]
