"""Teaching the language model how transcripts read, so that it rescores them better.

SmolLM2 learned English as it is written: cased, punctuated, numbers in digits. The
recognizer's candidates are none of that ("she paid two hundred and fifty dollars"), so the
model's score of a candidate mixes its surprise at the form with its judgement of the words.
A LoRA adapter trained with next-token loss on text in transcript form (the train split's
sentences, normalised exactly as the recognizer writes: the text the word trigram learns from)
takes the first away and teaches the second the task text's words. Each sentence is a document
of its own, between end-of-text tokens, as `llm.score` reads a candidate.

The adapter is for scoring only: merged into a copy of the model that rescores, never into the
model that answers, so Speculative Streaming's output stays the base model's.
"""

from __future__ import annotations

from pathlib import Path

from edgestream.llm.loading import LanguageModel
from edgestream.llm.score import document_start_id, text_log_probs
from edgestream.llm.shared import next_token_record

# Under a tenth of a percent of the train split's sentences are longer; the rest of one is cut.
MAX_SENTENCE_TOKENS = 62

# The bundled adapter for SmolLM2-135M-Instruct (`edgestream train rescorer`; its model card
# is weights/README.md), used by `--rescore smollm2` unless told otherwise.
DEFAULT_ADAPTER = Path(__file__).parent / "weights" / "smollm2-transcripts.safetensors"


def transcript_records(
    lm: LanguageModel, sentences: list[str], max_tokens: int = MAX_SENTENCE_TOKENS
) -> list[dict]:
    """Training sequences: end-of-text, the sentence's first `max_tokens` tokens, end-of-text;
    the loss covers every token after the first, the closing end-of-text included (as
    `score_end` scores it). A "sentence" may be several joined: a segment of continuous speech
    holds two or three, and an adapter that only ever read one reads them badly (docs/asr.md,
    "Rescoring continuous speech"); such texts need a larger `max_tokens`."""
    if not sentences:
        raise ValueError("no sentences to train on")
    if max_tokens < 1:
        raise ValueError(f"expected max_tokens >= 1, got {max_tokens}")
    start = document_start_id(lm)
    dim = lm.model.config.dim
    records = []
    for sentence in sentences:
        ids = lm.tokenizer.encode(sentence, add_special_tokens=False)[:max_tokens]
        records.append(next_token_record("transcript", [start, *ids, start], 1, dim))
    return records


def nats_per_token(lm: LanguageModel, sentences: list[str], group: int = 16) -> float:
    """Mean negative log-probability per token of `sentences`, each scored as `llm.score`
    scores a candidate (its closing end-of-text included): how well the model reads them."""
    if not sentences:
        raise ValueError("no sentences to score")
    total, tokens = 0.0, 0
    for i in range(0, len(sentences), group):
        chunk = sentences[i : i + group]
        total -= sum(text_log_probs(lm, chunk))
        tokens += sum(len(lm.tokenizer.encode(s, add_special_tokens=False)) + 1 for s in chunk)
    return total / tokens
