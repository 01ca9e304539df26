from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from edgestream.asr.decode import LmFusion, ctc_greedy, ctc_prefix_beam_search, make_vocabulary
from edgestream.asr.features import compute_fbank, load_audio
from edgestream.asr.lm import train_ngram
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import Recognizer, StreamingOptions


def _offline_log_probs(asr, samples: np.ndarray, options: StreamingOptions) -> np.ndarray:
    features = torch.from_numpy(asr.cmvn.normalize(compute_fbank(samples)))[None]
    with torch.no_grad():
        log_probs, _ = asr.model(
            features, torch.tensor([features.shape[1]]), options.chunk_frames, options.left_chunks
        )
    return log_probs[0].numpy()


def _offline_text(asr, samples: np.ndarray, options: StreamingOptions) -> str:
    return asr.vocabulary.decode(ctc_greedy(_offline_log_probs(asr, samples, options)))


def _stream(asr, samples: np.ndarray, options: StreamingOptions, seed: int) -> Recognizer:
    recognizer = Recognizer(asr, options)
    rng, start = np.random.default_rng(seed), 0
    while start < len(samples):
        size = int(rng.choice([0, 1, 159, 160, 401, 1600, 7777]))
        recognizer.accept_waveform(samples[start : start + size])
        start += size
    recognizer.finalize()
    return recognizer


@pytest.mark.parametrize(("chunk_ms", "left_chunks"), [(40, 0), (160, 2), (640, 4), (1280, 1)])
def test_streaming_text_equals_the_offline_chunk_masked_pass(
    random_model: Path, tiny_corpus: Path, chunk_ms: int, left_chunks: int
) -> None:
    asr = load_model(random_model)
    options = StreamingOptions(chunk_ms=chunk_ms, left_chunks=left_chunks)
    for number, entry in enumerate(read_manifest(tiny_corpus / "dev.jsonl")):
        samples = load_audio(tiny_corpus / entry.audio)
        streamed = _stream(asr, samples, options, seed=number).text
        assert len(streamed) > 5  # random weights: many (arbitrary) characters to compare
        assert streamed == _offline_text(asr, samples, options)


@pytest.mark.parametrize(("chunk_ms", "left_chunks"), [(160, 2), (640, 4)])
def test_streaming_with_a_language_model_equals_the_offline_beam_search(
    random_model: Path, tiny_corpus: Path, chunk_ms: int, left_chunks: int
) -> None:
    asr = load_model(random_model)
    entries = read_manifest(tiny_corpus / "dev.jsonl")
    lm = train_ngram([entry.text for entry in read_manifest(tiny_corpus / "train.jsonl")], 3)
    options = StreamingOptions(
        chunk_ms=chunk_ms,
        left_chunks=left_chunks,
        beam=6,
        lm=lm,
        # An endpoint commits the beam's best prefix and restarts the LM context, so the
        # one-shot search over the whole utterance is the reference only without endpoints.
        silence_before_text_s=1e9,
        silence_after_text_s=1e9,
        max_segment_s=1e9,
    )
    fusion = LmFusion(lm, asr.vocabulary)  # the default settings, as in the options
    for number, entry in enumerate(entries):
        samples = load_audio(tiny_corpus / entry.audio)
        streamed = _stream(asr, samples, options, seed=number).text
        log_probs = _offline_log_probs(asr, samples, options)
        offline = ctc_prefix_beam_search(log_probs, options.beam, fusion=fusion)
        assert streamed == asr.vocabulary.decode(offline)
    with pytest.raises(ValueError, match="needs beam search"):
        StreamingOptions(lm=lm)


def _frames(asr, pattern: str) -> np.ndarray:
    """Confident log-probs spelling `pattern`, with '_' for a blank frame."""
    ids = [0 if c == "_" else asr.vocabulary.encode(c)[0] for c in pattern]
    return np.log(np.eye(len(asr.vocabulary))[ids] * 0.97 + 0.001).astype(np.float32)


def test_endpoint_rules_split_the_text_without_changing_it(random_model: Path) -> None:
    asr = load_model(random_model)
    options = StreamingOptions(
        silence_after_text_s=1.2, silence_before_text_s=2.4, max_segment_s=2.0
    )
    recognizer = Recognizer(asr, options)
    pattern = (
        "_" * 70  # 2.8 s of silence before any text: an (empty) endpoint, no segment
        + "hi_ "
        + "_" * 30  # then 1.2 s of silence after text: "hi" closes
        + "_ _".join(["a_b_c"] * 24)
        + "_"  # a long run of words: cut between words past 2 s
    )
    log_probs = _frames(asr, pattern)
    for start in range(0, len(log_probs), 7):
        recognizer._decode(log_probs[start : start + 7])
    assert recognizer.segments[0] == "hi"
    assert len(recognizer.segments) >= 3
    assert all(len(s) < 30 for s in recognizer.segments[1:])
    assert recognizer.text == asr.vocabulary.decode(ctc_greedy(log_probs))


def test_long_bpe_segments_are_cut_before_a_piece_that_begins_a_word(random_model: Path) -> None:
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dogs",
        "while",
        "seven",
        "wizards",
        "hum",
    ]
    texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    vocabulary = make_vocabulary("bpe-45", texts * 20)  # most words take several pieces
    asr = replace(load_model(random_model), vocabulary=vocabulary)
    ids: list[int] = []
    for _ in range(3):
        for word in words:
            ids += vocabulary.encode(word)
    frames = [i for token in ids for i in (token, 0)]  # each piece followed by a blank frame
    log_probs = np.log(np.eye(len(vocabulary))[frames] * 0.97 + 0.001).astype(np.float32)
    recognizer = Recognizer(asr, StreamingOptions(max_segment_s=1.0))
    for start in range(0, len(log_probs), 5):
        recognizer._decode(log_probs[start : start + 5])
    assert len(recognizer.segments) >= 3
    assert all(set(segment.split()) <= set(words) for segment in recognizer.segments)
    assert recognizer.text == " ".join(words * 3) == vocabulary.decode(ctc_greedy(log_probs))


def test_memory_stays_flat_over_a_long_stream(random_model: Path) -> None:
    asr = load_model(random_model)
    options = StreamingOptions(chunk_ms=640, left_chunks=2)
    recognizer = Recognizer(asr, options)
    piece = np.zeros(16_000 * 5, np.float32)
    for _ in range(12 * 10):  # ten minutes
        recognizer.accept_waveform(piece)
        assert len(recognizer._features) < 4 * options.chunk_frames + 7
        cached = recognizer._encoder.caches[0].keys.shape[2]
        assert cached <= options.left_chunks * options.chunk_frames
    assert recognizer.seconds == pytest.approx(600)


def test_misuse_is_refused(random_model: Path) -> None:
    asr = load_model(random_model)
    recognizer = Recognizer(asr)
    with pytest.raises(ValueError, match="finite"):
        recognizer.accept_waveform(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="mono"):
        recognizer.accept_waveform(np.zeros((10, 2), np.float32))
    # Integer PCM, as a microphone buffer holds it, would be heard as noise 90 dB too loud.
    pcm = (np.sin(np.arange(1600) / 5) * 20_000).astype(np.int16)
    with pytest.raises(ValueError, match=r"got int16 \(16-bit PCM: divide by 32768\)"):
        recognizer.accept_waveform(pcm)
    with pytest.raises(ValueError, match=r"peak of \d+: integer PCM passed as floats"):
        recognizer.accept_waveform(pcm.astype(np.float32))
    recognizer.accept_waveform(pcm / 32768.0)  # scaled: accepted, as float64 too
    recognizer.accept_waveform([])  # nothing, in any form
    assert recognizer.seconds == 0.1
    assert recognizer.finalize() == recognizer.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        recognizer.accept_waveform(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="chunk"):
        StreamingOptions(chunk_ms=100)
    for name in ("silence_before_text_s", "silence_after_text_s", "max_segment_s"):
        with pytest.raises(ValueError, match=f"expected {name} > 0 seconds"):
            StreamingOptions(**{name: 0.0})


class _PickLast:
    """A rescorer that records what it is offered and keeps the worst candidate, so that its
    choice differs from the first pass's wherever there is a choice."""

    def __init__(self) -> None:
        self.offered: list[list[tuple[str, float]]] = []

    def __call__(self, candidates: list[tuple[str, float]]) -> str:
        self.offered.append(candidates)
        return candidates[-1][0]


def test_a_rescorer_chooses_each_closed_segment_among_distinct_candidates(
    random_model: Path,
) -> None:
    asr = load_model(random_model)
    # Three segments, closed by 1.2 s pauses, then finalize; unsure frames give the beam
    # alternatives to offer.
    pattern = ("_" * 32).join(["hi_ ", "a_b_c", "ab"]) + "_" * 3
    ids = [0 if c == "_" else asr.vocabulary.encode(c)[0] for c in pattern]
    unsure = np.eye(len(asr.vocabulary))[ids] * 0.6 + 0.4 / len(asr.vocabulary)
    log_probs = np.log(unsure).astype(np.float32)

    def run(options: StreamingOptions) -> Recognizer:
        recognizer = Recognizer(asr, options)
        for start in range(0, len(log_probs), 5):
            recognizer._decode(log_probs[start : start + 5])
        recognizer.finalize()  # no audio went in, so nothing is left to flush
        return recognizer

    first_pass = StreamingOptions(beam=6)
    rescorer = _PickLast()
    plain, rescored = run(first_pass), run(replace(first_pass, rescorer=rescorer, nbest=4))
    assert plain.segments == ["hi", "abc"] and plain.text == "hi abc ab"
    assert len(rescorer.offered) == 3  # two endpoints, then finalize
    for candidates in rescorer.offered:
        texts, scores = [t for t, _ in candidates], [s for _, s in candidates]
        assert 2 <= len(candidates) <= 4
        assert len(set(texts)) == len(texts)  # one entry per text, however BPE spelled it
        assert scores == sorted(scores, reverse=True)
    assert [candidates[0][0] for candidates in rescorer.offered] == ["hi", "abc", "ab"]
    chosen = [candidates[-1][0] for candidates in rescorer.offered]
    assert rescored.segments == chosen[:2]
    assert rescored.text == " ".join(t for t in chosen if t) != plain.text


def test_rescoring_needs_beam_search(random_model: Path) -> None:
    with pytest.raises(ValueError, match="rescoring needs beam search"):
        StreamingOptions(rescorer=_PickLast())
    with pytest.raises(ValueError, match="nbest"):
        StreamingOptions(beam=4, rescorer=_PickLast(), nbest=0)
