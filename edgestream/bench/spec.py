"""Benchmark: decoding methods against our AR engine, on Spec-Bench-style prompts or task suites.

Every method decodes every prompt in one process, methods interleaved per prompt (and the order
rotated) so machine load hits all alike. Reported per method, overall and per category:
tokens/s (end to end, prefill included), speedup over `ar` measured in the same run, mean
accepted tokens per forward pass, call reduction (AR passes / the method's passes) and the
fraction of prompts whose new token ids equal AR's (the lossless check).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edgestream.bench.environment import machine_facts
from edgestream.llm.engine import GenerationResult, check_request
from edgestream.llm.loading import LanguageModel, load_hf
from edgestream.llm.methods import Decoder
from edgestream.llm.tasks import CATEGORIES, task_prompts

REFERENCE_METHODS = ("hf-pld", "llamacpp")  # run outside our engine, as references
LLAMACPP_INSTALL = "make llamacpp (compiles llama-cpp-python from source, ~6 minutes)"


@dataclass(frozen=True)
class BenchPrompt:
    question_id: str
    category: str
    turns: tuple[str, ...]  # user turns; later turns see the model's own earlier answers


def read_spec_prompts(path: Path) -> list[BenchPrompt]:
    """Spec-Bench question file: one JSON object per line with question_id, category, turns."""
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = tuple(str(t) for t in row["turns"])
            prompts.append(BenchPrompt(str(row["question_id"]), str(row["category"]), turns))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(
                f"{path}:{number}: expected a JSON object with question_id, category, turns ({err})"
            ) from err
        if not turns or not all(t.strip() for t in turns):
            raise ValueError(f"{path}:{number}: turns must be a non-empty list of non-empty texts")
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} holds no questions")
    return prompts


def task_suite(limit: int, data_dir: str | Path | None = None) -> list[BenchPrompt]:
    """The fixed task suite: the first `limit` held-back test prompts of every category."""
    return [
        BenchPrompt(p.key, p.category, (p.prompt,))
        for category in CATEGORIES
        for p in task_prompts(category, "test", data_dir, limit)
    ]


CHAT_PROBE_KINDS = ("request", "coding", "open-question")


def chat_probe(data_dir: str | Path | None = None, per_kind: int = 8) -> list[BenchPrompt]:
    """Held-back chat prompts of the kinds the task suite's first few lack: up to `per_kind`
    each of request templates beyond the suite's (index 8 on), coding requests and questions
    asked without their context, evenly spaced. Built from the data, not shipped, because
    SQuAD's questions may not be redistributed here."""
    if per_kind < 1:
        raise ValueError(f"expected at least one chat-probe prompt per kind, got {per_kind}")
    test = task_prompts("chat", "test", data_dir)
    kinds = {
        "request": [p for p in test[8:] if "|" in p.key and not p.key.startswith("code|")],
        "coding": [p for p in test if p.key.startswith("code|")],
        "open-question": [p for p in test if p.key.startswith("open-")],
    }
    probe = []
    for kind in CHAT_PROBE_KINDS:
        items = kinds[kind]
        for p in items[:: max(1, len(items) // per_kind)][:per_kind]:
            probe.append(BenchPrompt(str(len(probe) + 1), kind, (p.prompt,)))
    return probe


SUITES = {"tasks": task_suite, "chat-probe": lambda limit, data: chat_probe(data, limit)}


@dataclass
class Tally:
    new_tokens: int = 0
    seconds: float = 0.0
    forward_passes: int = 0
    prompts: int = 0
    exact: int = 0

    def add(self, result: GenerationResult, exact: bool) -> None:
        self.new_tokens += result.new_tokens
        self.seconds += result.seconds
        self.forward_passes += result.forward_passes
        self.prompts += 1
        self.exact += exact

    def stats(self, baseline: Tally) -> dict[str, float]:
        tps = self.new_tokens / self.seconds if self.seconds else 0.0
        base_tps = baseline.new_tokens / baseline.seconds if baseline.seconds else 0.0
        return {
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(tps, 2),
            "speedup": round(tps / base_tps, 3) if base_tps else 0.0,
            "mean_accepted": round(self.new_tokens / max(1, self.forward_passes), 3),
            "call_reduction": round(baseline.forward_passes / max(1, self.forward_passes), 3),
            "exact_match_vs_ar": round(self.exact / max(1, self.prompts), 4),
        }


@dataclass
class MethodTallies:
    overall: Tally = field(default_factory=Tally)
    categories: dict[str, Tally] = field(default_factory=dict)

    def add(self, category: str, result: GenerationResult, exact: bool) -> None:
        self.overall.add(result, exact)
        self.categories.setdefault(category, Tally()).add(result, exact)


def _run_conversation(
    lm: LanguageModel, decoder: Decoder, prompt: BenchPrompt, max_new_tokens: int
) -> tuple[GenerationResult, list[list[int]]]:
    """All turns of one question; returns the summed result and each turn's token ids."""
    messages: list[dict[str, str]] = []
    total = GenerationResult([], 0, 0.0, "stop")
    turn_ids: list[list[int]] = []
    for turn in prompt.turns:
        messages.append({"role": "user", "content": turn})
        result = decoder(lm.encode_messages(messages), max_new_tokens, None)
        messages.append({"role": "assistant", "content": lm.decode(result.token_ids)})
        total = GenerationResult(
            total.token_ids + result.token_ids,
            total.forward_passes + result.forward_passes,
            total.seconds + result.seconds,
            result.finish_reason,
        )
        turn_ids.append(result.token_ids)
    return total, turn_ids


@torch.inference_mode()
def divergence(
    lm: LanguageModel, prompt: BenchPrompt, ar_turns: list[list[int]], turns: list[list[int]]
) -> dict[str, object]:
    """Where a method's tokens first leave ar's, and how close the base model's own logits
    were there: `logit_gap` = logit(ar's token) - logit(the method's), from one prefill of the
    shared context. A near-tie (a gap within the dtype's rounding) is the only divergence a
    lossless method may show; `None` where one of them stopped instead."""
    messages: list[dict[str, str]] = []
    for turn, (ar_ids, ids) in enumerate(zip(ar_turns, turns, strict=True)):
        messages.append({"role": "user", "content": prompt.turns[turn]})
        if ar_ids == ids:
            messages.append({"role": "assistant", "content": lm.decode(ar_ids)})
            continue
        shared = next(
            (i for i, (a, b) in enumerate(zip(ar_ids, ids, strict=False)) if a != b),
            min(len(ar_ids), len(ids)),
        )
        ar_token = ar_ids[shared] if shared < len(ar_ids) else None
        token = ids[shared] if shared < len(ids) else None
        gap = None
        if ar_token is not None and token is not None:
            context = lm.encode_messages(messages) + ar_ids[:shared]
            cache = lm.model.new_cache(len(context))
            logits = lm.model(torch.tensor([context]), cache, last_only=True)[0, -1]
            gap = round(float(logits[ar_token] - logits[token]), 4)
        return {
            "turn": turn,
            "position": shared,
            "ar_token": ar_token,
            "method_token": token,
            "logit_gap": gap,
        }
    raise ValueError("the two outputs are identical: no divergence")


def bench_spec(
    lm: LanguageModel,
    decoders: dict[str, Decoder],
    prompts: list[BenchPrompt],
    max_new_tokens: int,
    threads: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Run every method on every prompt; `decoders` must include "ar" (the baseline)."""
    if "ar" not in decoders:
        raise ValueError("the methods must include ar, the baseline every ratio is taken against")
    names = list(decoders)
    for decoder in decoders.values():  # warm-up: allocation and kernel selection, discarded
        decoder(lm.encode_messages([{"role": "user", "content": "Hello!"}]), 8, None)
    tallies = {name: MethodTallies() for name in names}
    divergent: list[dict[str, object]] = []
    for index, prompt in enumerate(prompts):
        order = names[index % len(names) :] + names[: index % len(names)]
        outputs = {n: _run_conversation(lm, decoders[n], prompt, max_new_tokens) for n in order}
        for name in names:
            result, turns = outputs[name]
            exact = turns == outputs["ar"][1]
            tallies[name].add(prompt.category, result, exact)
            if not exact:
                where = divergence(lm, prompt, outputs["ar"][1], turns)
                divergent.append({"method": name, "question_id": prompt.question_id, **where})
        if progress is not None:
            progress(index + 1, len(prompts))
    return {
        "model": lm.name,
        "max_new_tokens": max_new_tokens,
        "setup": {
            **machine_facts(threads),
            "dtype": lm.precision,
            "prompts": len(prompts),
            "decoding": "greedy, end to end (prefill included)",
        },
        "methods": {
            name: {
                "overall": t.overall.stats(tallies["ar"].overall),
                "categories": {
                    c: tally.stats(tallies["ar"].categories[c]) for c, tally in t.categories.items()
                },
            }
            for name, t in tallies.items()
        },
        "divergent": divergent,
        "divergence_summary": divergence_summary(divergent),
    }


def divergence_summary(divergent: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """Per method: how many prompts left ar's tokens, and the largest and median |logit gap|
    at the first differing token (the base model's own near-tie, if that is all it is)."""
    summary: dict[str, dict[str, object]] = {}
    for method in dict.fromkeys(d["method"] for d in divergent):
        rows = [d for d in divergent if d["method"] == method]
        gaps = sorted(abs(d["logit_gap"]) for d in rows if d["logit_gap"] is not None)
        summary[str(method)] = {
            "prompts": len(rows),
            "max_abs_logit_gap": gaps[-1] if gaps else None,
            "median_abs_logit_gap": gaps[len(gaps) // 2] if gaps else None,
            "stopped_differently": len(rows) - len(gaps),
        }
    return summary


def method_peak_memory(
    method: str, prompt: str, max_new_tokens: int, generate_options: list[str]
) -> float | None:
    """Peak resident memory (MiB) of a fresh `edgestream generate --method METHOD` process on
    one prompt: interpreter, libraries, model, the method's own weights and caches, as a user
    running that method alone would pay. None where the process cannot report it (not Linux)."""
    command = [sys.executable, "-m", "edgestream", "generate", prompt, "--method", method]
    command += ["--max-new-tokens", str(max_new_tokens), "--json", *generate_options]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:7])} ... failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]).get("peak_rss_mib")


def hf_prompt_lookup_decoder(lm: LanguageModel, num_tokens: int) -> Decoder:
    """transformers' own prompt lookup decoding (`generate(prompt_lookup_num_tokens=...)`,
    greedy) on a transformers copy of the same model, as an outside reference implementation.

    Forward passes are counted with a hook on the model, so `mean_accepted` compares."""
    hf_model, _ = load_hf(lm.name, lm.model.dtype)
    calls = [0]

    def count(*_: object) -> None:
        calls[0] += 1

    hf_model.register_forward_hook(count)
    stop = sorted(lm.stop_ids)

    def decode(ids: list[int], max_new_tokens: int, _on_token: object) -> GenerationResult:
        budget = check_request(ids, max_new_tokens, lm.context_length)
        inputs = torch.tensor([ids])
        calls[0] = 0
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=budget,
                do_sample=False,
                prompt_lookup_num_tokens=num_tokens,
                eos_token_id=stop,
                pad_token_id=stop[0],
            )
        seconds = time.perf_counter() - start
        new = out[0, len(ids) :].tolist()
        ended = next((i for i, t in enumerate(new) if t in lm.stop_ids), None)
        new = new if ended is None else new[: ended + 1]
        reason = "stop" if ended is not None else "length"
        return GenerationResult(new, calls[0], seconds, reason)

    return decode


def llamacpp_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def llamacpp_decoder(lm: LanguageModel, gguf: Path, threads: int) -> Decoder:
    """llama.cpp (through `llama-cpp-python`) on the model's own GGUF file, greedy, as what a
    user would run instead of our engine. Quantised weights (SmolLM2's GGUF is Q4_1) decode
    different tokens from our float engine, so its exact match is reported, not required.

    One forward pass per token (autoregressive), counted so `mean_accepted` is 1.0."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf),
        n_ctx=lm.context_length,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )

    def decode(ids: list[int], max_new_tokens: int, _on_token: object) -> GenerationResult:
        budget = check_request(ids, max_new_tokens, lm.context_length)
        new: list[int] = []
        # Forget the previous prompt: `generate` would otherwise reuse the longest common prefix
        # (a chat template's system prompt), skipping part of the prefill every other method
        # pays, and a prompt evaluated in other batches decodes other tokens at near-ties.
        llm.reset()
        start = time.perf_counter()
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True):
            new.append(token)
            if token in lm.stop_ids or len(new) == budget:
                break
        seconds = time.perf_counter() - start
        reason = "stop" if new[-1] in lm.stop_ids else "length"
        return GenerationResult(new, len(new), seconds, reason)

    return decode
