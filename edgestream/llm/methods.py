"""Decoding methods by name: what `generate --method` and `bench spec --methods` choose from.

A `Decoder` maps (prompt ids, max new tokens, token callback) to a `GenerationResult`, so every
method is run and measured the same way. "ss-pld" is Speculative Streaming with prompt
lookup: a lookup draft from a match of `lookup_alone_ngram` tokens or more is verified alone
(no stream pass), a shorter match's is grafted onto the stream tree (both in one pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from edgestream.llm.baselines import generate_draft, generate_medusa, generate_pld
from edgestream.llm.draft import load_draft
from edgestream.llm.engine import (
    GenerationResult,
    Sampling,
    TokenCallback,
    generate_ar,
    generate_ss,
)
from edgestream.llm.int8 import int8_available, int8_measured
from edgestream.llm.loading import LanguageModel
from edgestream.llm.medusa import load_medusa, medusa_for_drafting
from edgestream.llm.model import native_bfloat16
from edgestream.llm.msa import DraftHead, SpeculativeStreams, load_streams
from edgestream.llm.tree import TreeShape
from edgestream.llm.weights_file import read_weights

METHODS = ("ar", "ss", "ss-pld", "pld", "medusa", "draft")
DRAFT_DTYPES = ("auto", "float32", "bfloat16", "int8")
WEIGHTS_DIR = Path(__file__).parent / "weights"
BUNDLED_STREAMS = {"smollm2": WEIGHTS_DIR / "smollm2-ss-lossless.safetensors"}


class Decoder(Protocol):
    """Prompt token ids and a budget of new tokens -> the result; `on_token` sees each new
    token as it is accepted (for streaming the text out)."""

    def __call__(
        self, prompt_ids: list[int], max_new_tokens: int, on_token: TokenCallback | None = None
    ) -> GenerationResult: ...


@dataclass(frozen=True)
class MethodOptions:
    sampling: Sampling = field(default_factory=Sampling)
    streams_path: Path | None = None  # default: the bundled streams of the model, if any
    # Already loaded (e.g. a shared-mode adapter's), or already merged for drafting
    # (`SpeculativeStreams.merged_for`), which decoders of one model may share
    streams: SpeculativeStreams | None = None
    medusa_path: Path | None = None  # Medusa heads (`edgestream train medusa`); none bundled
    draft_path: Path | None = None  # draft model (`edgestream train draft`); none bundled
    draft_tokens: int = 4  # two-model speculative decoding: tokens drafted per pass
    tree: TreeShape = field(default_factory=TreeShape)
    pld_tokens: int = 10  # prompt lookup: longest draft
    pld_ngram: int = 3  # prompt lookup: longest n-gram matched
    lookup_tokens: int = 6  # ss-pld: longest prompt-lookup branch grafted onto the stream tree
    # ss-pld: a lookup match of at least this many tokens is verified alone, without streams
    # (0: always graft it onto the stream tree)
    lookup_alone_ngram: int = 2
    # Precision the streams and Medusa heads draft in (DRAFT_DTYPES; see `drafting_dtype`)
    draft_dtype: str = "auto"
    # ss, ss-pld: the streams may also draft context tokens outside their draft vocabulary
    context_drafts: bool = True


def drafting_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype drafters' weights are in (`torch.qint8` for "int8"). "auto", under a float32
    model: bfloat16 where the CPU has native bfloat16 matrix products (oneDNN says so), else
    int8 where PyTorch's x86 int8 kernels run; under any other model, the model's own dtype.

    Why it may differ from the model's: drafting a few rows is bound by reading the drafter's
    weights, and a draft only decides what is verified, never what is accepted, so the output
    stays the model's at any drafting precision (docs/speculative-streaming.md measures it).
    Where bfloat16 is native, int8 against bfloat16 has not been measured, so auto keeps the
    measured choice.
    """
    if name not in DRAFT_DTYPES:
        raise ValueError(f"unknown draft dtype {name!r}: expected one of {', '.join(DRAFT_DTYPES)}")
    if name == "int8" and not int8_available():
        raise ValueError("--draft-dtype int8: this PyTorch build has no quantised int8 engine")
    if name == "auto":
        if model_dtype != torch.float32:
            return model_dtype
        if native_bfloat16():
            return torch.bfloat16
        return torch.qint8 if int8_measured() else model_dtype
    return torch.qint8 if name == "int8" else getattr(torch, name)


def draft_dtype_name(dtype: torch.dtype) -> str:
    """The `--draft-dtype` name of a drafting dtype."""
    return "int8" if dtype == torch.qint8 else str(dtype).removeprefix("torch.")


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
    stop, sampling, tree = lm.stop_ids, options.sampling, options.tree
    draft_dtype = drafting_dtype(options.draft_dtype, lm.model.dtype)
    if method == "ar":
        return lambda prompt_ids, max_new_tokens, on_token=None: generate_ar(
            lm.model, prompt_ids, max_new_tokens, stop, sampling, on_token
        )
    if method == "pld":
        return lambda prompt_ids, max_new_tokens, on_token=None: generate_pld(
            lm.model,
            prompt_ids,
            max_new_tokens,
            stop,
            options.pld_tokens,
            options.pld_ngram,
            on_token,
            sampling,
        )
    if method == "medusa":
        if options.medusa_path is None:
            raise ValueError(
                "--method medusa needs heads: train them with `edgestream train medusa` "
                "and pass --medusa PATH"
            )
        heads = medusa_for_drafting(options.medusa_path, lm.model, draft_dtype)
        return lambda prompt_ids, max_new_tokens, on_token=None: generate_medusa(
            lm.model, heads, prompt_ids, max_new_tokens, stop, tree, on_token, sampling
        )
    if method == "draft":
        if options.draft_path is None:
            raise ValueError(
                "--method draft needs a draft model: train one with `edgestream train draft` "
                "and pass --draft PATH"
            )
        draft, _ = load_draft(options.draft_path, lm.model, int8=draft_dtype == torch.qint8)
        return lambda prompt_ids, max_new_tokens, on_token=None: generate_draft(
            lm.model,
            draft,
            prompt_ids,
            max_new_tokens,
            stop,
            options.draft_tokens,
            on_token,
            sampling,
        )
    streams = options.streams or resolve_streams(lm, options.streams_path)[0]
    if streams.draft_dtype is None:  # not merged yet: adapters folded in, in the drafting dtype
        streams = streams.merged_for(lm.model, draft_dtype)
    elif streams.draft_dtype != draft_dtype:
        raise ValueError(
            f"these streams were merged to draft in {streams.draft_dtype}, not {draft_dtype}"
        )
    head = DraftHead(lm.model, streams)
    lookup = options.lookup_tokens if method == "ss-pld" else 0
    return lambda prompt_ids, max_new_tokens, on_token=None: generate_ss(
        lm.model,
        streams,
        prompt_ids,
        max_new_tokens,
        stop,
        tree,
        on_token,
        head=head,
        sampling=sampling,
        lookup_tokens=lookup,
        lookup_ngram=options.pld_ngram,
        lookup_alone_ngram=options.lookup_alone_ngram if lookup else 0,
        context_drafts=options.context_drafts,
    )


def footprint(method: str, lm: LanguageModel, options: MethodOptions) -> dict[str, object]:
    """What a method adds to the base model: parameters stored ("extra_parameters"; for Medusa
    also "full_vocab_parameters", what the original's full-vocabulary heads hold) and how long
    its weights took to train ("train_seconds", from the weights file, where recorded)."""
    if method in ("ss", "ss-pld"):
        if options.streams is not None:
            return {"extra_parameters": options.streams.extra_parameters()}
        streams, info = resolve_streams(lm, options.streams_path)
        return {"extra_parameters": streams.extra_parameters(), **_train_seconds(info)}
    if method == "medusa" and options.medusa_path is not None:
        heads, info = load_medusa(options.medusa_path, lm.model)
        return {
            "extra_parameters": heads.extra_parameters(),
            "full_vocab_parameters": heads.full_vocab_parameters(),
            **_train_seconds(info),
        }
    if method == "draft" and options.draft_path is not None:
        tensors, _, info = read_weights(options.draft_path, "draft_config", "draft model")
        return {
            "extra_parameters": sum(t.numel() for t in tensors.values()),
            **_train_seconds(info),
        }
    return {"extra_parameters": 0}


def _train_seconds(info: dict) -> dict[str, int]:
    """Training wall time from a weights file's info (distillation included where recorded)."""
    if "wall_seconds" in info:
        return {"train_seconds": int(info["wall_seconds"])}
    parts = [info.get(k) for k in ("wall_seconds_training", "wall_seconds_distillation")]
    if any(parts):
        return {"train_seconds": int(sum(x for x in parts if x))}
    return {}
