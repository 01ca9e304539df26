"""The autoregressive decoding loop: the baseline every speed-up is measured against.

One forward pass per new token over a preallocated KV cache. Greedy by default; temperature and
nucleus (top-p) sampling with a seeded generator when asked. The result counts forward passes,
so drafting methods can report mean accepted tokens per pass on the same footing (1.0 here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from torch import Tensor

from edgestream.llm.model import Transformer

TokenCallback = Callable[[int], None]


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy when temperature is 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class TokenPicker:
    """Chooses tokens from logits according to a `Sampling`, with its own random generator."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.generator = torch.Generator()
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        else:
            self.generator.seed()

    def __call__(self, logits: Tensor) -> int:
        """logits (vocab,) float32 -> token id. `.item()` is a host sync, needed to stop at EOS."""
        if self.sampling.greedy:
            return int(logits.argmax())
        probs = torch.softmax(logits / self.sampling.temperature, dim=-1)
        if self.sampling.top_p < 1:
            probs = _top_p_filter(probs, self.sampling.top_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (renormalised)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum()


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only, including a final stop token if one was produced
    forward_passes: int  # model calls, prefill included
    seconds: float  # wall time, prefill included
    finish_reason: str  # "stop" (a stop token), "length" (max_new_tokens) or "context" (full)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """New tokens per forward pass: 1.0 for autoregressive decoding."""
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0


def check_request(prompt_ids: list[int], max_new_tokens: int, context_length: int) -> int:
    """Validate a request; return how many new tokens fit in the context (<= max_new_tokens)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(prompt_ids) >= context_length:
        raise ValueError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {context_length}"
        )
    return min(max_new_tokens, context_length - len(prompt_ids))


@torch.inference_mode()
def generate_ar(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    sampling: Sampling = Sampling(),
    on_token: TokenCallback | None = None,
) -> GenerationResult:
    """Decode one token per forward pass until a stop token, max_new_tokens or the context end."""
    budget = check_request(prompt_ids, max_new_tokens, model.config.max_position)
    pick = TokenPicker(sampling)
    start = time.perf_counter()
    cache = model.new_cache(len(prompt_ids) + budget)
    logits = model(torch.tensor([prompt_ids]), cache, last_only=True)
    passes, new_ids = 1, []
    while True:
        token = pick(logits[0, -1])
        new_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids or len(new_ids) == budget:
            break
        logits = model(torch.tensor([[token]]), cache)
        passes += 1
    seconds = time.perf_counter() - start
    if new_ids[-1] in stop_ids:
        reason = "stop"
    else:
        reason = "length" if budget == max_new_tokens else "context"
    return GenerationResult(new_ids, passes, seconds, reason)
