"""Benchmark: our autoregressive engine against transformers' `generate`, in one run.

Both decode the same prompts greedily with the same threads, interleaved prompt by prompt (and
alternating which goes first) so that load on a shared machine hits both alike. Reports
end-to-end tokens/s (prefill included), the speedup ratio and whether the tokens are identical.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from edgestream.bench.environment import machine_facts
from edgestream.llm.engine import generate_ar
from edgestream.llm.loading import (
    engine_from_hf,
    float_precision,
    load_hf,
    parse_dtype,
    resolve_model,
)
from edgestream.llm.model import Transformer

# A fixed, varied set of chat prompts: facts, explanation, code, maths, list, rewrite, story.
DEFAULT_PROMPTS = (
    "What is the capital of France?",
    "Explain in a few sentences how a refrigerator keeps food cold.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain.",
    "List five tips for staying focused while studying.",
    "Rewrite this sentence more formally: gonna grab some food, back in a bit.",
    "Write a SQL query that returns the ten most recent orders from a table named orders.",
    "Tell a short story about a lighthouse keeper who finds a message in a bottle.",
)


@dataclass
class PromptTiming:
    prompt: str
    new_tokens: int
    ours_seconds: float  # median over repeats
    hf_seconds: float
    exact_match: bool  # our token ids == transformers' on every repeat


@dataclass
class DtypeResult:
    dtype: str
    prompts: list[PromptTiming] = field(default_factory=list)

    @property
    def ours_tokens_per_second(self) -> float:
        return sum(p.new_tokens for p in self.prompts) / sum(p.ours_seconds for p in self.prompts)

    @property
    def hf_tokens_per_second(self) -> float:
        return sum(p.new_tokens for p in self.prompts) / sum(p.hf_seconds for p in self.prompts)

    @property
    def speedup(self) -> float:
        return self.ours_tokens_per_second / self.hf_tokens_per_second

    @property
    def exact_match(self) -> float:
        return sum(p.exact_match for p in self.prompts) / len(self.prompts)

    def summary(self) -> dict[str, object]:
        ratios = [p.hf_seconds / p.ours_seconds for p in self.prompts]
        return {
            "dtype": self.dtype,
            "transformers_dtype": float_precision(self.dtype),
            "ours_tokens_per_second": self.ours_tokens_per_second,
            "transformers_tokens_per_second": self.hf_tokens_per_second,
            "speedup": self.speedup,
            "per_prompt_speedup_median": statistics.median(ratios),
            "per_prompt_speedup_min": min(ratios),
            "per_prompt_speedup_max": max(ratios),
            "exact_match": self.exact_match,
            "new_tokens": sum(p.new_tokens for p in self.prompts),
            "prompts": [asdict(p) for p in self.prompts],
        }


def _chat_ids(tokenizer: object, prompt: str) -> list[int]:
    messages = [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def _time_hf(
    hf_model: object, ids: list[int], max_new_tokens: int, eos: int
) -> tuple[list[int], float]:
    inputs = torch.tensor([ids])
    start = time.perf_counter()
    out = hf_model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - start


def _time_ours(
    model: Transformer, ids: list[int], max_new_tokens: int, eos: int
) -> tuple[list[int], float]:
    result = generate_ar(model, ids, max_new_tokens, {eos})
    return result.token_ids, result.seconds


def bench_dtype(
    model_name: str,
    dtype: str,
    prompts: list[str],
    max_new_tokens: int,
    repeats: int,
    progress: Callable[[str], None] | None = None,
) -> DtypeResult:
    """Time both engines on every prompt `repeats` times, interleaved; medians per prompt.

    Under q4_1 transformers runs in float32: it dequantises a GGUF and has no 4-bit CPU path,
    so float32 is what a transformers user gets from the same file.
    """
    hf_model, tokenizer = load_hf(model_name, parse_dtype(float_precision(dtype)))
    ours = engine_from_hf(hf_model, dtype, resolve_model(model_name))
    eos = tokenizer.eos_token_id
    timers = {"ours": (_time_ours, ours), "transformers": (_time_hf, hf_model)}
    encoded = [_chat_ids(tokenizer, p) for p in prompts]
    result = DtypeResult(dtype)
    with torch.inference_mode():
        # Warm-up: first calls pay for allocation and kernel selection; discard them.
        for timer, model in timers.values():
            timer(model, encoded[0], 8, eos)
        for prompt, ids in zip(prompts, encoded, strict=False):
            seconds: dict[str, list[float]] = {name: [] for name in timers}
            match = True
            for rep in range(repeats):
                order = list(timers) if rep % 2 == 0 else list(timers)[::-1]
                tokens = {}
                for name in order:
                    timer, model = timers[name]
                    tokens[name], elapsed = timer(model, ids, max_new_tokens, eos)
                    seconds[name].append(elapsed)
                match = match and tokens["ours"] == tokens["transformers"]
            result.prompts.append(
                PromptTiming(
                    prompt=prompt,
                    new_tokens=len(tokens["ours"]),
                    ours_seconds=statistics.median(seconds["ours"]),
                    hf_seconds=statistics.median(seconds["transformers"]),
                    exact_match=match,
                )
            )
            if progress is not None:
                progress(prompt)
    return result


def bench_generate(
    model_name: str,
    dtypes: list[str],
    prompts: list[str],
    max_new_tokens: int,
    repeats: int,
    threads: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """The whole benchmark as a JSON-ready dict: setup, then one summary per dtype."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not prompts:
        raise ValueError("no prompts to benchmark")
    torch.set_num_threads(threads)
    results = [
        bench_dtype(model_name, d, prompts, max_new_tokens, repeats, progress) for d in dtypes
    ]
    return {
        "setup": {
            **machine_facts(threads),
            "model": model_name,
            "prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "repeats": repeats,
            "decoding": "greedy, chat template, end to end (prefill included)",
        },
        "results": [r.summary() for r in results],
    }
