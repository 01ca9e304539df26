from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from edgestream.llm.loading import load_language_model
from edgestream.llm.score import document_start_id, text_log_probs

TEXTS = ["the cat sat", "a dog ran to the park and back", "", "the"]


def test_batched_scores_equal_transformers_one_text_at_a_time(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    start = document_start_id(lm)
    batched = text_log_probs(lm, TEXTS)
    without_end = text_log_probs(lm, TEXTS, score_end=False)
    for text, score, score_no_end in zip(TEXTS, batched, without_end, strict=True):
        ids = [start, *lm.tokenizer.encode(text, add_special_tokens=False), start]
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0]
        per_token = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
        assert score == pytest.approx(float(per_token.sum()), abs=1e-3)
        assert score_no_end == pytest.approx(float(per_token[:-1].sum()), abs=1e-3)
    assert text_log_probs(lm, []) == []


def test_a_text_longer_than_the_context_is_refused(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    with pytest.raises(ValueError, match="exceeds the model's"):
        text_log_probs(lm, ["the cat sat " * 200])
