"""Audio in, answer out: the one place where the speech and language engines meet.

An `Assistant` holds one loaded recognizer model and one loaded language model and serves any
number of callers: the CLI runs it once over a file, the server once per connection. Each audio
stream gets its own `Recognizer` (caches are per stream, weights are shared). Answers are
decoded one at a time behind a lock: two decodes on a 2-core CPU would only slow each other
down and make their tokens/s meaningless.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgestream.asr.audio import SAMPLE_RATE
from edgestream.asr.model_io import AsrModel, load_model
from edgestream.asr.streaming import Recognizer, Segment, StreamingOptions, recommended_options
from edgestream.asr.transcribe import Transcript, transcribe_file
from edgestream.assist.rescore import LlmRescorer, load_rescorer
from edgestream.llm.engine import GenerationResult, TokenCallback
from edgestream.llm.loading import LanguageModel, float_precision, load_language_model
from edgestream.llm.methods import (
    Decoder,
    MethodOptions,
    drafting_dtype,
    make_decoder,
    resolve_streams,
)
from edgestream.llm.msa import SpeculativeStreams

__all__ = [
    "ANSWER_METHODS",
    "DEFAULT_ANSWER_METHOD",
    "SAMPLE_RATE",
    "Answer",
    "Assistant",
    "AssistantConfig",
    "Segment",
]

# What the assistant offers. Prompt lookup alone has little to copy from a spoken question,
# but grafted onto the streams (ss-pld) it also matches the answer so far, which SmolLM2's
# long answers often repeat.
ANSWER_METHODS = ("ss-pld", "ss", "ar")
# The default, measured on the chat probe's open questions, requests and coding requests,
# the kinds a spoken question is: ss-pld over AR 1.42x / 1.39x / 1.19x against ss's 1.35x /
# 1.33x / 1.13x on an Intel Xeon (stop 37), 1.21x / 1.12x / 1.04x against 1.13x / 1.04x /
# 0.92x on an AVX2-only AMD EPYC (stop 44); both lossless (docs/serve.md).
DEFAULT_ANSWER_METHOD = "ss-pld"


@dataclass(frozen=True)
class AssistantConfig:
    asr_model: str = "default"  # a bundled name or a model file
    llm: str = "smollm2"  # a model name or a local directory / GGUF file
    dtype: str = "float32"
    streams_path: Path | None = None  # stream weights for ss (default: the bundled ones)
    # What `transcribe` decodes with: beam search and the bundled word LM (greedy: 'none')
    streaming: StreamingOptions = field(default_factory=recommended_options)
    max_new_tokens: int = 128
    # Rescore each transcript segment's candidates with the answering model (needs beam
    # search): the model is loaded anyway, and it lowers the word error (docs/asr.md).
    rescore: bool = True
    # 'none': rescore with the answering model itself. 'default' (the bundled transcript
    # adapter) or an adapter file: rescore with a second copy of the model that has the
    # adapter merged, which hears better but costs another copy's memory and load time; the
    # answering model is never adapted, so answers stay the base model's.
    rescore_adapter: str = "none"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class Answer:
    text: str
    method: str
    result: GenerationResult
    baseline: GenerationResult | None = None  # the same answer decoded with ar, when compared

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or self.baseline.tokens_per_second == 0:
            return None
        return self.result.tokens_per_second / self.baseline.tokens_per_second

    @property
    def identical_to_ar(self) -> bool | None:
        return None if self.baseline is None else self.baseline.token_ids == self.result.token_ids

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {
            "text": self.text,
            "method": self.method,
            "new_tokens": self.result.new_tokens,
            "seconds": round(self.result.seconds, 4),
            "tokens_per_second": round(self.result.tokens_per_second, 2),
            "mean_accepted": round(self.result.mean_accepted, 3),
            "finish_reason": self.result.finish_reason,
        }
        if self.baseline is not None:
            record["ar_tokens_per_second"] = round(self.baseline.tokens_per_second, 2)
            record["speedup"] = round(self.speedup or 0.0, 3)
            record["identical_to_ar"] = self.identical_to_ar
        return record


class Assistant:
    """A loaded recognizer and language model, shared by every stream and request."""

    def __init__(self, asr: AsrModel, lm: LanguageModel, config: AssistantConfig) -> None:
        self.asr, self.lm, self.config = asr, lm, config
        self.streaming = config.streaming
        if config.rescore and self.streaming.beam and self.streaming.rescorer is None:
            self.streaming = replace(self.streaming, rescorer=LlmRescorer(lm))
        self._decoders: dict[str, Decoder] = {}
        self._streams: SpeculativeStreams | None = None
        self._decode_lock = threading.Lock()
        self._methods: list[str] | None = None

    @classmethod
    def load(cls, config: AssistantConfig = AssistantConfig()) -> Assistant:
        asr = load_model(config.asr_model)
        streaming = config.streaming
        wants_copy = config.rescore and config.rescore_adapter != "none"
        if wants_copy and streaming.beam and streaming.rescorer is None:
            # An adapter's LoRA merges into float weights, which q4_1's 4-bit blocks are not.
            dtype = float_precision(config.dtype)
            rescorer = load_rescorer(config.llm, dtype, config.rescore_adapter)
            config = replace(config, streaming=replace(streaming, rescorer=rescorer))
        return cls(asr, load_language_model(config.llm, config.dtype), config)

    def recognizer(self) -> Recognizer:
        """A fresh recognizer for one audio stream."""
        return Recognizer(self.asr, self.streaming)

    def transcribe(
        self,
        path: str | Path,
        on_partial: Callable[[str], None] | None = None,
        on_segment: Callable[[Segment], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Transcript:
        """`path` (`-`: a live stream on standard input) through a fresh recognizer; see
        `transcribe_file` for the callbacks."""
        return transcribe_file(self.asr, path, self.streaming, on_partial, on_segment, stop)

    def methods(self) -> list[str]:
        """The answer methods this model can run (ss needs stream weights for it)."""
        if self._methods is None:
            available = []
            for method in ANSWER_METHODS:
                try:
                    self.decoder(method)
                except (ValueError, FileNotFoundError):
                    continue
                available.append(method)
            self._methods = available
        return self._methods

    def decoder(self, method: str) -> Decoder:
        """The decoder for `method`, built (stream weights loaded) on first use."""
        if method not in ANSWER_METHODS:
            raise ValueError(
                f"unknown method {method!r}: expected one of {', '.join(ANSWER_METHODS)}"
            )
        if method not in self._decoders:
            streams = None if method == "ar" else self._merged_streams()
            options = MethodOptions(streams=streams)
            self._decoders[method] = make_decoder(method, self.lm, options)
        return self._decoders[method]

    def _merged_streams(self) -> SpeculativeStreams:
        """The streams, merged for drafting once and shared by ss and ss-pld: each merge is a
        copy of the stream layers (about 150 MB for SmolLM2's)."""
        if self._streams is None:
            streams, _ = resolve_streams(self.lm, self.config.streams_path)
            dtype = drafting_dtype(MethodOptions.draft_dtype, self.lm.model.dtype)
            self._streams = streams.merged_for(self.lm.model, dtype)
        return self._streams

    def answer(
        self,
        question: str,
        method: str = DEFAULT_ANSWER_METHOD,
        on_token: TokenCallback | None = None,
        max_new_tokens: int | None = None,
        compare: bool = False,
    ) -> Answer:
        """Answer `question` (a user turn in the chat template); `compare` also decodes with ar
        to report the speedup and check the answer is token-identical."""
        decode = self.decoder(method)
        prompt_ids = self.lm.encode_prompt(question)
        budget = max_new_tokens or self.config.max_new_tokens
        if budget < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {budget}")
        with self._decode_lock:
            result = decode(prompt_ids, budget, on_token)
            baseline = None
            if compare and method != "ar":
                baseline = self.decoder("ar")(prompt_ids, budget, None)
        return Answer(self.lm.decode(result.token_ids), method, result, baseline)
