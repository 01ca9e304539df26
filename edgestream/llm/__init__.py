"""Speculative Streaming LLM decoding: the engine, the speculative streams and the baselines.

The names below are the library's front door (docs/python-api.md), imported on first use so
that importing one submodule does not load the rest:

    from edgestream.llm import load_language_model, make_decoder

    lm = load_language_model("smollm2")  # our engine and the tokenizer; float32
    decode = make_decoder("ss", lm)  # the bundled streams; "ar", "ss-pld", "pld", ...
    result = decode(lm.encode_prompt("Why is the sky blue?"), 128)
    print(lm.decode(result.token_ids), result.mean_accepted)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgestream.lazy_exports import lazy_exports

_EXPORTS = {
    "load_language_model": "edgestream.llm.loading",
    "LanguageModel": "edgestream.llm.loading",
    "TextDeltas": "edgestream.llm.loading",
    "make_decoder": "edgestream.llm.methods",
    "MethodOptions": "edgestream.llm.methods",
    "METHODS": "edgestream.llm.methods",
    "Decoder": "edgestream.llm.methods",
    "GenerationResult": "edgestream.llm.engine",
    "Sampling": "edgestream.llm.engine",
    "TreeShape": "edgestream.llm.tree",
}

if TYPE_CHECKING:
    from edgestream.llm.engine import GenerationResult, Sampling
    from edgestream.llm.loading import LanguageModel, TextDeltas, load_language_model
    from edgestream.llm.methods import METHODS, Decoder, MethodOptions, make_decoder
    from edgestream.llm.tree import TreeShape

__all__ = [
    "METHODS",
    "Decoder",
    "GenerationResult",
    "LanguageModel",
    "MethodOptions",
    "Sampling",
    "TextDeltas",
    "TreeShape",
    "load_language_model",
    "make_decoder",
]  # the keys of _EXPORTS


__getattr__ = lazy_exports(__name__, _EXPORTS)
