"""The streaming recognizer: audio in pieces of any length, partial results, endpoints, finalize.

Per stream it keeps three caches: the fbank extractor's unfinished window (`StreamingFbank`),
the fbank frames the next subsampled frames still need (the subsampling convolutions are
unpadded in time, so encoder frame i reads fbank frames 4i..4i+6), and per layer the last
`left_chunks * chunk` keys and values plus the causal convolution's last inputs. Whole chunks
go through the encoder as soon as their fbank frames exist; `finalize` flushes the rest as a
last, shorter chunk. The final text therefore equals the offline chunk-masked forward pass
with the same chunk and left context (tested).

Endpointing follows sherpa-onnx's rules, counted in encoder frames whose best token is blank:
a segment ends after `silence_before_text_s` of it when nothing was recognised yet, after
`silence_after_text_s` once something was, or, past `max_segment_s`, at the next word break
(after a space, or before a BPE piece that begins a word).
An endpoint closes the current segment's text and restarts the decoder; the acoustic caches
carry on, so with greedy decoding endpoints do not change the text, only how it is split
(except that a pause of `silence_after_text_s` always separates words). With beam search an
endpoint commits the best prefix and restarts the language model's context at a sentence
start, as any streaming recognizer must; between endpoints the text equals a one-shot beam
search over the same frames (tested).

A `SegmentRescorer` (optional, with beam search) is a second pass: when a segment closes, it
picks the segment's text among the beam's best `nbest` candidates, e.g. by a neural language
model's score (`edgestream.assist.rescore`). Partial results stay the first pass's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgestream.asr.decode import BLANK, GreedyDecoder, LmFusion, PrefixBeamDecoder, Vocabulary
from edgestream.asr.features import (
    HOP_SAMPLES,
    SAMPLE_RATE,
    WINDOW_SAMPLES,
    GlobalCmvn,
    StreamingFbank,
)
from edgestream.asr.frames import (
    ENCODER_FRAME_MS,
    SUBSAMPLING_CONTEXT,
    SUBSAMPLING_FACTOR,
    encoder_frames,
)
from edgestream.asr.lm import LM_BEAM, NgramLm, load_lm
from edgestream.asr.vad import WINDOW, SileroVad


class SegmentRescorer(Protocol):
    """A closed segment's candidates, (text, first-pass log-score) best first -> its text."""

    def __call__(self, candidates: list[tuple[str, float]]) -> str: ...


@dataclass(frozen=True)
class StreamingOptions:
    """How a `Recognizer` chunks, decodes and ends segments. The defaults decode greedily,
    without a language model; `recommended_options()` gives what `transcribe` uses."""

    chunk_ms: int = 640
    left_chunks: int = 4  # attention context before the current chunk, in chunks
    beam: int = 0  # 0: greedy; otherwise the prefix beam search width
    lm: NgramLm | None = None  # a word LM fused into the beam search (needs beam >= 1)
    lm_weight: float = LmFusion.weight
    word_bonus: float = LmFusion.word_bonus
    unknown_penalty: float = LmFusion.unknown_penalty
    vad: SileroVad | None = None  # endpoint on its non-speech instead of on CTC blanks
    silence_before_text_s: float = 2.4
    silence_after_text_s: float = 1.2
    max_segment_s: float = 20.0
    rescorer: SegmentRescorer | None = None  # second pass over each closed segment (beam >= 1)
    nbest: int = 8  # candidates the rescorer chooses among

    def __post_init__(self) -> None:
        if self.chunk_ms < ENCODER_FRAME_MS or self.chunk_ms % ENCODER_FRAME_MS:
            raise ValueError(
                f"expected a chunk of a positive multiple of {ENCODER_FRAME_MS} ms, "
                f"got {self.chunk_ms}"
            )
        if self.left_chunks < 0:
            raise ValueError(f"expected left_chunks >= 0, got {self.left_chunks}")
        if self.beam < 0:
            raise ValueError(f"expected beam >= 0, got {self.beam}")
        if self.lm is not None and self.beam == 0:
            raise ValueError("a language model needs beam search: expected beam >= 1")
        if self.rescorer is not None and self.beam == 0:
            raise ValueError("rescoring needs beam search's candidates: expected beam >= 1")
        if self.nbest < 1:
            raise ValueError(f"expected nbest >= 1, got {self.nbest}")
        for name in ("silence_before_text_s", "silence_after_text_s", "max_segment_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"expected {name} > 0 seconds, got {getattr(self, name)}")

    @property
    def chunk_frames(self) -> int:
        return self.chunk_ms // ENCODER_FRAME_MS


# Float audio may overshoot full scale a little (float WAV files do); a peak past this is
# integer PCM passed as floats, which would be heard as noise 90 dB too loud.
MAX_PEAK = 2.0


def _checked_samples(samples: np.ndarray) -> np.ndarray:
    """`accept_waveform`'s input as float32, or a ValueError that says what is wrong with it."""
    samples = np.asarray(samples)
    if samples.size and not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(
            f"expected float samples in [-1, 1], got {samples.dtype} (16-bit PCM: divide by 32768)"
        )
    samples = samples.astype(np.float32, copy=False)
    if samples.ndim != 1:
        raise ValueError(f"expected mono samples of shape (n,), got {samples.shape}")
    if not np.all(np.isfinite(samples)):
        raise ValueError("expected finite samples, got NaN or infinity")
    peak = float(np.abs(samples).max()) if samples.size else 0.0
    if peak > MAX_PEAK:
        raise ValueError(
            f"expected samples in [-1, 1], got a peak of {peak:g}: integer PCM passed as "
            "floats? (16-bit PCM: divide by 32768)"
        )
    return samples


def recommended_options(lm: str | Path = "default", **changes: Any) -> StreamingOptions:
    """The decoding `transcribe` uses: a prefix beam of `LM_BEAM` with a word LM fused in
    ('default': the bundled one; a file: an ARPA LM; 'none': greedy decoding, no beam).

    `StreamingOptions()` alone decodes greedily, which makes twice the word errors (synthetic
    test set, run 18: 16.4% against 8.3%); library callers start here.
    `changes` sets any other field, e.g. `recommended_options(chunk_ms=320)`.
    """
    language_model = load_lm(lm)
    beam = LM_BEAM if language_model is not None else 0
    return replace(StreamingOptions(beam=beam, lm=language_model), **changes)


class ChunkEncoder(Protocol):
    """One stream's encoder with its caches: a window of CMVN-normalised fbank frames (the
    frames behind the next encoder frames) and the absolute index of its first encoder frame
    -> CTC log-probs (encoder frames, vocabulary)."""

    def __call__(self, window: np.ndarray, offset: int) -> np.ndarray: ...


class StreamingModel(Protocol):
    """What a recognizer needs of a model, whatever runs it (PyTorch, onnxruntime)."""

    cmvn: GlobalCmvn
    vocabulary: Vocabulary

    def chunk_encoder(self, max_cached: int) -> ChunkEncoder:
        """A fresh encoder keeping the last `max_cached` encoder frames of attention context."""
        ...


@dataclass(frozen=True)
class Segment:
    """A closed stretch of speech: its text, and where in the audio it was heard, in seconds:
    the centres of its first and last encoder frames whose best token is not blank. CTC's
    spikes sit within a frame or two (40-80 ms) of the words' edges."""

    text: str
    start_s: float
    end_s: float

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "start": round(self.start_s, 2), "end": round(self.end_s, 2)}


def _frame_centre_s(frame: int) -> float:
    """The middle of the audio that encoder frame `frame` reads (fbank frames 4i..4i+6)."""
    first_sample = SUBSAMPLING_FACTOR * frame * HOP_SAMPLES
    last_sample = (SUBSAMPLING_FACTOR * frame + SUBSAMPLING_CONTEXT - 1) * HOP_SAMPLES
    return (first_sample + last_sample + WINDOW_SAMPLES) / 2 / SAMPLE_RATE


class Recognizer:
    """One audio stream. Feed `accept_waveform`, read `text` (partial), end with `finalize`."""

    def __init__(self, asr: StreamingModel, options: StreamingOptions = StreamingOptions()) -> None:
        self.asr, self.options = asr, options
        self._fbank = StreamingFbank()
        self._features = np.zeros((0, asr.cmvn.mean.shape[0]), np.float32)
        self._features_start = 0  # absolute index of self._features[0]
        self._encoded = 0  # encoder frames computed so far
        self._encoder = asr.chunk_encoder(options.left_chunks * options.chunk_frames)
        self.segments: list[str] = []  # texts of the segments closed by endpoints
        self.segment_spans: list[tuple[float, float]] = []  # where each was heard, in seconds
        self._heard: tuple[int, int] | None = None  # the open segment's first, last token frame
        self._decoder = self._new_decoder()
        self._silent_frames = 0
        self._segment_frames = 0
        self.samples_accepted = 0
        self.finished = False
        self._vad = options.vad.stream() if options.vad is not None else None
        self._vad_windows: deque[tuple[int, bool]] = deque()  # (end sample, speech?) not yet used
        self._speech_end = 0  # sample where the last speech window ended, or the last endpoint
        self._vad_time = 0  # the end of the audio behind the last decoded frame, in samples
        self._closed_text: str | None = None  # the last segment's text once finalize closed it

    def _new_decoder(self) -> GreedyDecoder | PrefixBeamDecoder:
        options = self.options
        if not options.beam:
            return GreedyDecoder()
        fusion = None
        if options.lm is not None:
            fusion = LmFusion(
                options.lm,
                self.asr.vocabulary,
                options.lm_weight,
                options.word_bonus,
                options.unknown_penalty,
            )
        return PrefixBeamDecoder(options.beam, fusion=fusion)

    @property
    def partial(self) -> str:
        """The open segment's text: what follows `segments` (after `finalize`, the last one)."""
        if self._closed_text is not None:
            return self._closed_text
        return self.asr.vocabulary.decode(self._decoder.ids)

    @property
    def partial_segment(self) -> Segment | None:
        """The open segment (after `finalize`, the last one) with where it was heard so far;
        None while it holds no text."""
        text = self.partial
        return Segment(text, *self._heard_span()) if text else None

    def segment(self, index: int) -> Segment:
        """Closed segment `index`, with where it was heard."""
        return Segment(self.segments[index], *self.segment_spans[index])

    def _heard_span(self) -> tuple[float, float]:
        """Where the open segment's tokens were heard, in seconds (beam search may find text
        where no frame's best token is one: then the last frame)."""
        first, last = self._heard or (max(0, self._encoded - 1),) * 2
        return _frame_centre_s(first), _frame_centre_s(last)

    @property
    def text(self) -> str:
        """Everything recognised so far: closed segments and the current partial."""
        return " ".join(s for s in [*self.segments, self.partial] if s)

    def _segment_text(self) -> str:
        """The current segment's final text: the first pass's best, or the rescorer's choice."""
        decoder, rescorer = self._decoder, self.options.rescorer
        if rescorer is None or not isinstance(decoder, PrefixBeamDecoder):
            return self.asr.vocabulary.decode(decoder.ids)
        candidates: dict[str, float] = {}
        for ids, score in decoder.nbest(self.options.nbest):
            # BPE may spell one text in several ways: keep each text once, at its best score.
            candidates.setdefault(self.asr.vocabulary.decode(ids), score)
        return rescorer(list(candidates.items()))

    def accept_waveform(self, samples: np.ndarray) -> None:
        """samples: float (n,) mono at 16 kHz in [-1, 1]; any n, including 0."""
        if self.finished:
            raise RuntimeError("this stream was finalized: start a new Recognizer")
        samples = _checked_samples(samples)
        if self._vad is not None:
            first = self._vad.windows
            for k, probability in enumerate(self._vad.accept(samples)):
                is_speech = bool(probability >= self._vad.vad.threshold)
                self._vad_windows.append(((first + k + 1) * WINDOW, is_speech))
        self.samples_accepted += len(samples)
        frames = self._fbank.accept_waveform(samples)
        if len(frames):
            self._features = np.concatenate([self._features, self.asr.cmvn.normalize(frames)])
        chunk = self.options.chunk_frames
        while self._available_encoder_frames() >= chunk:
            self._encode(chunk)

    def finalize(self) -> str:
        """Encode what is left as a last shorter chunk; returns the whole text."""
        if not self.finished:
            remaining = self._available_encoder_frames()
            if remaining:
                self._encode(remaining)
            if self.options.rescorer is not None:
                self._closed_text = self._segment_text()
            self.finished = True
        return self.text

    @property
    def seconds(self) -> float:
        return self.samples_accepted / SAMPLE_RATE

    def _available_encoder_frames(self) -> int:
        total_fbank = self._features_start + len(self._features)
        return encoder_frames(total_fbank) - self._encoded

    def _encode(self, frames: int) -> None:
        first = SUBSAMPLING_FACTOR * self._encoded - self._features_start
        last = SUBSAMPLING_FACTOR * (self._encoded + frames - 1) + SUBSAMPLING_CONTEXT
        window = self._features[first : last - self._features_start]
        log_probs = self._encoder(window, self._encoded)
        self._encoded += frames
        keep_from = SUBSAMPLING_FACTOR * self._encoded - self._features_start
        self._features = self._features[keep_from:]
        self._features_start += keep_from
        self._decode(log_probs)

    def _vad_silence_s(self, frame: int) -> float:
        """Seconds without speech, by the VAD, up to the end of encoder frame `frame`'s audio."""
        frame_end = (SUBSAMPLING_FACTOR * frame + SUBSAMPLING_CONTEXT - 1) * HOP_SAMPLES
        frame_end += WINDOW_SAMPLES
        self._vad_time = frame_end
        while self._vad_windows and self._vad_windows[0][0] <= frame_end:
            end, is_speech = self._vad_windows.popleft()
            if is_speech:
                self._speech_end = end
        return max(0, frame_end - self._speech_end) / SAMPLE_RATE

    def _decode(self, log_probs: np.ndarray) -> None:
        frame_s = ENCODER_FRAME_MS / 1000
        first = self._encoded - len(log_probs)
        for start in range(len(log_probs)):  # frame by frame: an endpoint may fall mid-chunk
            frame = log_probs[start : start + 1]
            if self._cut_before(frame):
                self._endpoint()
            self._decoder.advance(frame)
            self._segment_frames += 1
            if frame[0].argmax() == BLANK:
                self._silent_frames += 1
            else:
                self._silent_frames = 0
                at = first + start
                self._heard = (at, at) if self._heard is None else (self._heard[0], at)
            silence_s, segment_s = self._silent_frames * frame_s, self._segment_frames * frame_s
            if self._vad is not None:
                silence_s = self._vad_silence_s(first + start)
            ids = self._decoder.ids
            # A long segment is cut only between words, so the cut cannot split one.
            between_words = self._silent_frames > 0 and (
                not ids or self.asr.vocabulary.is_word_end(ids[-1])
            )
            if (
                (not ids and silence_s >= self.options.silence_before_text_s)
                or (ids and silence_s >= self.options.silence_after_text_s)
                or (between_words and segment_s >= self.options.max_segment_s)
            ):
                self._endpoint()

    def _cut_before(self, frame: np.ndarray) -> bool:
        """Past `max_segment_s`, a segment may also end just before a piece that begins a word
        after a pause: BPE pieces carry their word break in front, so no piece ends a word."""
        token = int(frame[0].argmax())
        return (
            token != BLANK
            and self._silent_frames > 0
            and bool(self._decoder.ids)
            and self._segment_frames * ENCODER_FRAME_MS / 1000 >= self.options.max_segment_s
            and self.asr.vocabulary.starts_word(token)
        )

    def _endpoint(self) -> None:
        current = self._segment_text()
        if current:
            self.segments.append(current)
            self.segment_spans.append(self._heard_span())
        self._heard = None
        self._decoder = self._new_decoder()
        self._silent_frames = self._segment_frames = 0
        self._speech_end = self._vad_time  # VAD silence counts again from here
