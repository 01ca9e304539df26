"""Is one recognizer's WER really lower than another's? A paired bootstrap over utterances.

Two runs of `edgestream bench asr --hypotheses FILE` on the same manifest give each
utterance's reference and hypothesis twice. Pooled WER (total errors / total reference words)
is a ratio, so a release decision cannot rest on the mean of per-utterance WERs; instead the
utterances are resampled with replacement, the same draw for both runs, and the pooled WER
difference recomputed each time. The 2.5th and 97.5th percentiles of those differences bound
it: an interval that straddles 0 means the test set cannot tell the two apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np


@dataclass(frozen=True)
class Scored:
    """One utterance's word errors (substitutions + deletions + insertions) and length."""

    group: str
    errors: int
    words: int


def read_hypotheses(path: Path) -> dict[str, Scored]:
    """`--hypotheses` JSON Lines, keyed by audio path, each utterance's errors counted again."""
    if not path.is_file():
        raise FileNotFoundError(f"expected a hypotheses file (bench asr --hypotheses) at {path}")
    scored = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            reference, hypothesis = row["reference"], row["hypothesis"]
            audio, group = row["audio"], row.get("group", "all")
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path}, line {number}: not a hypotheses line ({error})") from None
        scored[audio] = _score(reference, hypothesis, group)
    if not scored:
        raise ValueError(f"{path} holds no utterances")
    return scored


def _score(reference: str, hypothesis: str, group: str) -> Scored:
    words = len(reference.split())
    if not words:  # jiwer refuses an empty reference; every hypothesis word is an insertion
        return Scored(group, len(hypothesis.split()), 0)
    out = jiwer.process_words(reference, hypothesis)
    return Scored(group, out.substitutions + out.deletions + out.insertions, words)


def compare_runs(
    before: dict[str, Scored], after: dict[str, Scored], rounds: int = 10_000, seed: int = 0
) -> dict[str, dict]:
    """Pooled WER of each run and after - before in percentage points with a 95% paired
    bootstrap interval, overall and per group (the groups of `before`)."""
    if before.keys() != after.keys():
        missing = sorted(before.keys() ^ after.keys())
        raise ValueError(
            f"the two runs scored different utterances ({len(missing)} in only one, "
            f"e.g. {missing[0]}): run both on the same manifest"
        )
    audio = sorted(before)
    rng = np.random.default_rng(seed)

    def compare(members: list[str]) -> dict:
        return _compare([before[a] for a in members], [after[a] for a in members], rounds, rng)

    groups = sorted({before[a].group for a in audio})
    return {
        "overall": compare(audio),
        "groups": {g: compare([a for a in audio if before[a].group == g]) for g in groups},
    }


def _compare(
    before: list[Scored], after: list[Scored], rounds: int, rng: np.random.Generator
) -> dict:
    words = np.array([s.words for s in before])
    errors_before = np.array([s.errors for s in before])
    errors_after = np.array([s.errors for s in after])
    if words.sum() == 0:
        raise ValueError("the references hold no words to score")
    draws = rng.integers(0, len(words), size=(rounds, len(words)))
    # Each draw's pooled WER difference (the clip guards a draw of empty references alone)
    drawn_words = np.maximum(words[draws].sum(axis=1), 1)
    differences = (errors_after[draws].sum(axis=1) - errors_before[draws].sum(axis=1)) / drawn_words
    low, high = np.percentile(100 * differences, [2.5, 97.5])
    wer_before, wer_after = errors_before.sum() / words.sum(), errors_after.sum() / words.sum()
    return {
        "utterances": len(words),
        "words": int(words.sum()),
        "wer_before": round(100 * float(wer_before), 2),
        "wer_after": round(100 * float(wer_after), 2),
        "difference": round(100 * float(wer_after - wer_before), 2),
        "low": round(float(low), 2),
        "high": round(float(high), 2),
        "better": int((errors_after < errors_before).sum()),
        "worse": int((errors_after > errors_before).sum()),
    }
