"""Second-pass rescoring of speech recognition candidates with the assistant's language model.

The recognizer's first pass (CTC prefix beam search with a word trigram) keeps a beam of
candidate transcripts for each segment. When the segment closes, `LlmRescorer` scores each
candidate with the language model (`edgestream.llm.score`) and keeps the one with the best

    first-pass score + weight * ln p_llm(text) + word_bonus * words

A trigram judges three words at a time; the language model reads the whole segment and knows
English far beyond the trigram's training text, so it can tell "ten of clubs" from "ten of
close". This is the classic two-pass design (a cheap LM in the search, a strong one over its
N best); it lives here, not in `edgestream.asr`, because the two engines never import each other.
`load_rescorer` merges a LoRA adapter trained on transcript text (`transcript_lm`) into the
rescoring model by default, so that it judges the words rather than their unwritten form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgestream.assist.transcript_lm import DEFAULT_ADAPTER
from edgestream.llm.loading import DEFAULT_MODEL, LanguageModel, load_language_model
from edgestream.llm.score import text_log_probs
from edgestream.llm.shared import load_adapter


@dataclass(frozen=True)
class LlmRescorer:
    """A `SegmentRescorer` backed by a language model. Defaults chosen on dev (docs/asr.md)."""

    lm: LanguageModel
    # Chosen on the dev set's even half, checked on its odd half (docs/asr.md): 9.38% -> 8.43%.
    weight: float = 0.5
    word_bonus: float = 1.0
    # A segment whose best candidate leads the next by more than this (first-pass log-score)
    # keeps it unasked: on dev a third of the segments, at the same WER.
    skip_margin: float = 4.0
    adapter: str | None = None  # the LoRA adapter merged into `lm`, by file name, if any

    def __str__(self) -> str:
        model = self.lm.name if self.adapter is None else f"{self.lm.name} + {self.adapter}"
        return f"{model} rescoring (weight {self.weight:g})"

    def __call__(self, candidates: list[tuple[str, float]]) -> str:
        if len(candidates) < 2 or candidates[0][1] - candidates[1][1] > self.skip_margin:
            return candidates[0][0] if candidates else ""
        texts = [text for text, _ in candidates]
        llm_scores = text_log_probs(self.lm, texts)
        totals = [
            first + self.weight * llm + self.word_bonus * len(text.split())
            for (text, first), llm in zip(candidates, llm_scores, strict=True)
        ]
        return texts[max(range(len(texts)), key=totals.__getitem__)]


def load_rescorer(
    name: str, dtype: str = "float32", adapter: str = "default"
) -> LlmRescorer | None:
    """'none' -> None; otherwise a language model by name or path (`load_language_model`) with
    a LoRA adapter merged in: `adapter` 'default' is the bundled transcript adapter for the
    default model (`transcript_lm`; no adapter for any other model), 'none' the plain model,
    or else an adapter file (`edgestream train rescorer`)."""
    if name == "none":
        return None
    path = rescoring_adapter(name, adapter)
    lm = load_language_model(name, dtype, pack=path is None)  # an adapter merges into plain layers
    if path is not None:
        load_adapter(path, lm)
    return LlmRescorer(lm, adapter=None if path is None else path.name)


def rescoring_adapter(name: str, adapter: str) -> Path | None:
    """The adapter file `load_rescorer` merges into model `name`, or None for the plain model."""
    if adapter == "none" or (adapter == "default" and name != DEFAULT_MODEL):
        return None
    path = DEFAULT_ADAPTER if adapter == "default" else Path(adapter)
    if not path.is_file():
        raise FileNotFoundError(f"no rescoring adapter at {path}")
    return path
