"""Task quality of the language model: does fine-tuning (LoRA, shared-mode SS) pay, and what does
Speculative Streaming cost or save on the same task?

Each variant (the base model, or the base with an adapter merged in) answers the task's
held-back test prompts greedily; the answers are scored with the task's usual metric:
ROUGE-1 / ROUGE-Lsum F1 (the `rouge-score` package, stemmed) for DialogSum and E2E, exact match
of normalised SQL for Spider, final-answer accuracy for GSM8K. Where the variant has streams
(a shared-mode adapter's, or the bundled lossless streams for the base model), the same prompts
are decoded with Speculative Streaming too: tokens/s against AR in the same run, accepted
tokens per pass, and whether the answers are token-identical.

A few dozen prompts give a wide margin of error, so each variant is also compared with the one
before it, prompt by prompt: the mean difference of the metric with a 95% paired bootstrap
interval (`paired_difference`). An interval that straddles 0 means the prompts cannot tell the
two apart.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgestream.llm.methods import Decoder
from edgestream.llm.tasks import TaskPrompt

QUALITY_TASKS = ("dialogsum", "e2e", "spider", "gsm8k")
METRICS = {
    "dialogsum": ("rouge1", "rougeLsum"),
    "e2e": ("rouge1", "rougeLsum"),
    "spider": ("exact_match",),
    "gsm8k": ("accuracy",),
}


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-Lsum F1 (x100); sentences split on full stops for Lsum."""
    return means(rouge_per_prompt(predictions, references))


def rouge_per_prompt(
    predictions: Sequence[str], references: Sequence[str]
) -> dict[str, list[float]]:
    """ROUGE-1 and ROUGE-Lsum F1 (x100) of each prediction against its reference."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeLsum"], use_stemmer=True)
    scores: dict[str, list[float]] = {"rouge1": [], "rougeLsum": []}
    for prediction, reference in zip(predictions, references, strict=True):
        pair = scorer.score(_sentences(reference), _sentences(prediction))
        for key, values in scores.items():
            values.append(100 * pair[key].fmeasure)
    return scores


def means(scores: dict[str, list[float]]) -> dict[str, float]:
    """Per-prompt scores -> their means, rounded as reported."""
    return {k: round(sum(v) / max(1, len(v)), 2) for k, v in scores.items()}


def _sentences(text: str) -> str:
    return "\n".join(s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip())


def normalise_sql(text: str) -> str:
    """SQL compared as text: the first statement, code fences and case, spacing and quotes
    normalised (Spider's exact-set match needs its parser; this is its plain-text version).

    >>> normalise_sql("```sql\\nSELECT  count(*) FROM Users WHERE name = \\"Ada\\";\\n```")
    "select count ( * ) from users where name = 'ada'"
    """
    fenced = re.search(r"```(?:sql)?\s*(.*?)```", text, flags=re.S | re.I)
    sql = fenced.group(1) if fenced else text
    sql = sql.split(";")[0].replace('"', "'").lower()
    sql = re.sub(r"([(),*=<>])", r" \1 ", sql)
    return " ".join(sql.split())


def final_number(text: str) -> float | None:
    """The last number in a text (thousands separators dropped), e.g. a GSM8K answer.

    >>> final_number("She pays 3 x $1,250 = $3,750.")
    3750.0
    """
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:
        return None


def score(task: str, predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """The task's metrics, averaged over the prompts (x100)."""
    return means(per_prompt(task, predictions, references))


def per_prompt(
    task: str, predictions: Sequence[str], references: Sequence[str]
) -> dict[str, list[float]]:
    """The task's metrics for each prompt (x100; 0 or 100 for exact match and accuracy)."""
    if task in ("dialogsum", "e2e"):
        return rouge_per_prompt(predictions, references)
    pairs = list(zip(predictions, references, strict=True))
    if task == "spider":
        return {"exact_match": [100.0 * (normalise_sql(p) == normalise_sql(r)) for p, r in pairs]}
    if task == "gsm8k":
        return {
            "accuracy": [
                100.0 * ((got := final_number(p)) is not None and got == final_number(r))
                for p, r in pairs
            ]
        }
    raise ValueError(f"unknown task {task!r}: expected one of {', '.join(QUALITY_TASKS)}")


def paired_difference(
    before: Sequence[float], after: Sequence[float], rounds: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """Mean of after - before over the same prompts, with a 95% bootstrap interval (prompts
    resampled with replacement, percentile method; seeded, so the report is reproducible).

    >>> paired_difference([10, 20, 30], [10, 20, 30])
    {'difference': 0.0, 'low': 0.0, 'high': 0.0}
    """
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    if not diffs:
        raise ValueError("no prompts to compare")
    rng, n = random.Random(seed), len(diffs)
    resampled = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(rounds))
    low, high = resampled[int(0.025 * rounds)], resampled[int(0.975 * rounds) - 1]
    return {"difference": round(sum(diffs) / n, 2), "low": round(low, 2), "high": round(high, 2)}


@dataclass
class Decoded:
    texts: list[str]
    token_ids: list[list[int]]
    new_tokens: int
    seconds: float
    passes: int


def decode_all(
    decoders: dict[str, Decoder],
    encode: Callable[[str], list[int]],
    decode_text: Callable[[list[int]], str],
    prompts: Sequence[TaskPrompt],
    max_new_tokens: int,
    progress: Callable[[], None] | None = None,
) -> dict[str, Decoded]:
    """Every prompt through every decoder, decoders interleaved per prompt (order rotated),
    so machine load hits them alike."""
    names = list(decoders)
    out = {name: Decoded([], [], 0, 0.0, 0) for name in names}
    for index, prompt in enumerate(prompts):
        ids = encode(prompt.prompt)
        for name in names[index % len(names) :] + names[: index % len(names)]:
            result = decoders[name](ids, max_new_tokens, None)
            into = out[name]
            into.texts.append(decode_text(result.token_ids))
            into.token_ids.append(result.token_ids)
            into.new_tokens += result.new_tokens
            into.seconds += result.seconds
            into.passes += result.forward_passes
        if progress is not None:
            progress()
    return out


def speed_stats(ar: Decoded, ss: Decoded) -> dict[str, float]:
    ar_tps, ss_tps = ar.new_tokens / ar.seconds, ss.new_tokens / ss.seconds
    same = sum(a == b for a, b in zip(ar.token_ids, ss.token_ids, strict=True))
    return {
        "ar_tokens_per_second": round(ar_tps, 2),
        "ss_tokens_per_second": round(ss_tps, 2),
        "speedup": round(ss_tps / ar_tps, 3),
        "mean_accepted": round(ss.new_tokens / max(1, ss.passes), 3),
        "exact_match_vs_ar": round(same / max(1, len(ar.token_ids)), 4),
    }
