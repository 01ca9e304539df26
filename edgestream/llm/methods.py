"""Decoding methods by name: what `generate --method` and `bench spec --methods` choose from.

A `Decoder` maps (prompt ids, max new tokens, token callback) to a `GenerationResult`, so every
method is run and measured the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgestream.llm.baselines import generate_pld
from edgestream.llm.engine import (
    GenerationResult,
    Sampling,
    TokenCallback,
    generate_ar,
    generate_ss,
)
from edgestream.llm.loading import LanguageModel
from edgestream.llm.msa import DraftHead, SpeculativeStreams, load_streams
from edgestream.llm.tree import TreeShape

METHODS = ("ar", "ss", "pld")
WEIGHTS_DIR = Path(__file__).parent / "weights"
BUNDLED_STREAMS = {"smollm2": WEIGHTS_DIR / "smollm2-ss-lossless.safetensors"}

Decoder = Callable[[list[int], int, TokenCallback | None], GenerationResult]


@dataclass(frozen=True)
class MethodOptions:
    sampling: Sampling = field(default_factory=Sampling)
    streams_path: Path | None = None  # default: the bundled streams of the model, if any
    tree: TreeShape = field(default_factory=TreeShape)
    pld_tokens: int = 10  # prompt lookup: longest draft
    pld_ngram: int = 3  # prompt lookup: longest n-gram matched


def resolve_streams(lm: LanguageModel, path: Path | None) -> tuple[SpeculativeStreams, dict]:
    if path is None:
        path = BUNDLED_STREAMS.get(lm.name)
        if path is None:
            raise ValueError(f"no bundled streams for model {lm.name!r}: pass --streams PATH")
        if not path.is_file():
            raise FileNotFoundError(
                f"the bundled streams for {lm.name!r} are missing ({path}); "
                "train them with `edgestream train streams` or pass --streams PATH"
            )
    return load_streams(path, lm.model)


def make_decoder(
    method: str, lm: LanguageModel, options: MethodOptions = MethodOptions()
) -> Decoder:
    """A ready-to-call decoder; loads whatever the method needs (e.g. stream weights) now."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    stop = lm.stop_ids
    if method == "ar":
        return lambda ids, n, cb: generate_ar(lm.model, ids, n, stop, options.sampling, cb)
    if not options.sampling.greedy:
        raise ValueError(
            f"--method {method} decodes greedily for now: sampling (temperature > 0) needs "
            "speculative sampling, not yet implemented; use --method ar"
        )
    if method == "pld":
        return lambda ids, n, cb: generate_pld(
            lm.model, ids, n, stop, options.pld_tokens, options.pld_ngram, cb
        )
    streams, _ = resolve_streams(lm, options.streams_path)
    head = DraftHead(lm.model, streams)
    return lambda ids, n, cb: generate_ss(
        lm.model, streams, ids, n, stop, options.tree, cb, head=head
    )
