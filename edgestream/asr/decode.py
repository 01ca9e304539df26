"""CTC output units (characters or SentencePiece BPE pieces) and CTC decoding: greedy and
prefix beam search.

Id 0 is the CTC blank. The character vocabulary is the transcript alphabet of `text.VOCAB`
(a-z, apostrophe, space). Both decoders take log-probabilities (T, V) as a numpy array, in
pieces of any length.
"""

from __future__ import annotations

import base64
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import sentencepiece as spm

from edgestream.asr.lm import BOS, NgramLm
from edgestream.asr.text import VOCAB

BLANK = 0


class Vocabulary(Protocol):
    """CTC output units: ids 1..len-1 (0 is the blank) <-> transcript text."""

    def __len__(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def is_word_end(self, token: int) -> bool:
        """Whether a word certainly ends after `token` (endpointing may cut there)."""
        ...

    def starts_word(self, token: int) -> bool:
        """Whether `token` certainly begins a new word (endpointing may cut before it)."""
        ...

    def piece_text(self, token: int) -> str:
        """The text `token` appends to a transcript, a space marking a word break."""
        ...

    def to_metadata(self) -> dict[str, str]: ...


class CharVocabulary:
    """Transcript characters as CTC ids 1..len(VOCAB); 0 is the blank."""

    def __init__(self, characters: str = VOCAB) -> None:
        self.characters = characters
        self._ids = {c: i + 1 for i, c in enumerate(characters)}

    def __len__(self) -> int:
        return len(self.characters) + 1

    def encode(self, text: str) -> list[int]:
        """Text -> ids; refuses characters outside the vocabulary.

        >>> CharVocabulary().encode("ab c")
        [1, 2, 28, 3]
        """
        unknown = sorted({c for c in text if c not in self._ids})
        if unknown:
            raise ValueError(
                f"expected transcript characters from {self.characters!r}, got {unknown}"
            )
        return [self._ids[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        """Ids (no blanks) -> text, spaces collapsed and trimmed."""
        return " ".join("".join(self.characters[i - 1] for i in ids).split())

    def is_word_end(self, token: int) -> bool:
        return self.characters[token - 1] == " "

    def starts_word(self, token: int) -> bool:
        return False  # a letter may follow a space or another letter; the space itself ends words

    def piece_text(self, token: int) -> str:
        return self.characters[token - 1]

    def to_metadata(self) -> dict[str, str]:
        return {"vocabulary": "char", "characters": self.characters}


class BpeVocabulary:
    """SentencePiece BPE pieces as CTC ids 1..size (piece id + 1; 0 is the blank)."""

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self._processor = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(cls, texts: list[str], size: int) -> BpeVocabulary:
        """Learn `size` pieces from transcripts (deterministic for the same texts)."""
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=size,
            model_type="bpe",
            character_coverage=1.0,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            num_threads=1,
            minloglevel=2,
        )
        return cls(model.getvalue())

    def __len__(self) -> int:
        return self._processor.get_piece_size() + 1

    def encode(self, text: str) -> list[int]:
        return [i + 1 for i in self._processor.encode(text)]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self._processor.decode([i - 1 for i in ids]).split())

    def is_word_end(self, token: int) -> bool:
        return False  # a piece never says that the word is over: the next one would

    def starts_word(self, token: int) -> bool:
        return self._processor.id_to_piece(token - 1).startswith("\u2581")

    def piece_text(self, token: int) -> str:
        return self._processor.id_to_piece(token - 1).replace("\u2581", " ")

    def to_metadata(self) -> dict[str, str]:
        return {"vocabulary": "bpe", "sentencepiece": base64.b64encode(self.model_proto).decode()}


def make_vocabulary(kind: str, texts: list[str]) -> Vocabulary:
    """ "char", or "bpe-N" (N pieces learnt from `texts`)."""
    if kind == "char":
        return CharVocabulary()
    if kind.startswith("bpe-") and kind[4:].isdigit():
        return BpeVocabulary.train(texts, int(kind[4:]))
    raise ValueError(f"unknown vocabulary {kind!r}: expected 'char' or 'bpe-N' (e.g. bpe-256)")


def vocabulary_from_metadata(metadata: dict[str, str]) -> Vocabulary:
    kind = metadata.get("vocabulary", "char")
    if kind == "char":
        return CharVocabulary(metadata["characters"])
    if kind == "bpe":
        return BpeVocabulary(base64.b64decode(metadata["sentencepiece"]))
    raise ValueError(f"unknown vocabulary kind {kind!r} in the model file")


class GreedyDecoder:
    """Incremental CTC greedy decoding: best id per frame, repeats merged, blanks dropped.

    Frames may arrive in pieces of any length; `ids` equals decoding them all at once."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._previous = BLANK

    def advance(self, log_probs: np.ndarray) -> None:
        """log_probs: (frames, V) for the next frames."""
        for token in log_probs.argmax(axis=-1).tolist():
            if token != BLANK and token != self._previous:
                self.ids.append(token)
            self._previous = token


def ctc_greedy(log_probs: np.ndarray) -> list[int]:
    """Greedy decoding of a whole utterance.

    >>> ctc_greedy(np.log(np.array([[.1, .9, 0], [.1, .9, 0], [.9, .1, 0], [.1, .9, 0]]) + 1e-9))
    [1, 1]
    """
    decoder = GreedyDecoder()
    decoder.advance(log_probs)
    return decoder.ids


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


@dataclass(frozen=True)
class LmFusion:
    """Shallow fusion of a word language model into CTC prefix beam search.

    A prefix scores log p_ctc + weight * ln p_lm(words) + word_bonus * words, the LM term
    added as each word completes (Hannun et al., 2014); the bonus offsets the LM's per-word
    cost, which would otherwise favour dropping words. Words outside the LM score as <unk>
    plus `unknown_penalty` per character, and so does an unfinished word that no LM word
    begins with: without that, a prefix that never finishes its unknown word (running the
    next words into it) dodges the LM and wins (measured: the LM then raised the dev WER from
    39.7% to 47.9%); per character, so that a run-on costs more than the words it swallows.
    """

    lm: NgramLm
    vocabulary: Vocabulary
    # Defaults chosen on the dev set (docs/asr.md): weight 0.7, bonus 2, -1.5 per character
    # (retuned for the run-7 model: 0.5 had been chosen for a model with twice its errors).
    weight: float = 0.7
    word_bonus: float = 2.0
    unknown_penalty: float = -1.5  # per character of an unknown word


@dataclass(frozen=True)
class _Words:
    """What a prefix means to the LM: the last complete words, the unfinished one, its score."""

    context: tuple[str, ...]
    partial: str
    score: float


class PrefixBeamDecoder:
    """Incremental CTC prefix beam search (Hannun et al., 2014), optionally with a word LM.

    Every prefix keeps two log-scores: ending in blank and ending in its last label, so that
    "a a" (with a blank between) and "a" (repeated frames) stay distinct. Per frame only the
    `token_beam` best tokens are expanded, and of those only the ones within `token_threshold`
    (natural log) of the frame's best: most frames are confidently blank, and expanding their
    unlikely letters is most of the work (measured on dev with the LM, beam 16: a threshold of
    8 cuts the decoding time by 38% with the same WER; 5 cuts it by 64% for +0.1 point).
    Then the `beam` best prefixes are kept (ranked with the LM's score where there is one).
    """

    def __init__(
        self,
        beam: int = 8,
        token_beam: int = 8,
        fusion: LmFusion | None = None,
        token_threshold: float = 8.0,
    ) -> None:
        if beam < 1 or token_beam < 1 or token_threshold <= 0:
            raise ValueError(
                f"expected beam, token_beam >= 1 and token_threshold > 0, got {beam}, "
                f"{token_beam}, {token_threshold}"
            )
        self.beam, self.token_beam, self.fusion = beam, token_beam, fusion
        self.token_threshold = token_threshold
        self._beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, -math.inf)}
        self._words: dict[tuple[int, ...], _Words] = {(): _Words((BOS,), "", 0.0)}

    @property
    def ids(self) -> list[int]:
        """The best prefix so far (its unfinished word scored as if complete)."""
        return list(max(self._beams, key=lambda prefix: self._score(prefix, final=True)))

    def nbest(self, n: int) -> list[tuple[list[int], float]]:
        """Up to `n` prefixes, best first, with their final scores (unfinished words completed):
        the candidates a second pass (e.g. a neural LM) may rescore."""
        scored = [(list(prefix), self._score(prefix, final=True)) for prefix in self._beams]
        return sorted(scored, key=lambda item: item[1], reverse=True)[:n]

    def advance(self, log_probs: np.ndarray) -> None:
        for frame in log_probs:
            self._step(frame)

    def _score(self, prefix: tuple[int, ...], final: bool = False) -> float:
        acoustic = _logaddexp(*self._beams[prefix])
        if self.fusion is None:
            return acoustic
        words = self._words[prefix]
        if final and words.partial:
            words = self._complete(words)
        elif words.partial and not self.fusion.lm.starts_a_word(words.partial):
            return acoustic + words.score + self.fusion.unknown_penalty * len(words.partial)
        return acoustic + words.score

    def _complete(self, words: _Words) -> _Words:
        fusion = self.fusion
        assert fusion is not None
        gain = fusion.weight * fusion.lm.log_prob(words.context, words.partial)
        if words.partial not in fusion.lm:
            gain += fusion.unknown_penalty * len(words.partial)
        context = (*words.context, words.partial)[-max(1, fusion.lm.order - 1) :]
        return _Words(context, "", words.score + gain + fusion.word_bonus)

    def _extend(self, prefix: tuple[int, ...], token: int) -> tuple[int, ...]:
        extended = (*prefix, token)
        if self.fusion is not None and extended not in self._words:
            words = self._words[prefix]
            for character in self.fusion.vocabulary.piece_text(token):
                if character != " ":
                    words = _Words(words.context, words.partial + character, words.score)
                elif words.partial:
                    words = self._complete(words)
            self._words[extended] = words
        return extended

    def _step(self, frame: np.ndarray) -> None:
        candidates = np.argsort(frame)[::-1][: self.token_beam]
        candidates = candidates[frame[candidates] >= frame[candidates[0]] - self.token_threshold]
        scores: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [-math.inf, -math.inf])
        for prefix, (p_blank, p_label) in self._beams.items():
            total = _logaddexp(p_blank, p_label)
            for token in candidates.tolist():
                p = float(frame[token])
                if token == BLANK:
                    entry = scores[prefix]
                    entry[0] = _logaddexp(entry[0], total + p)
                    continue
                extended = scores[self._extend(prefix, token)]
                if prefix and prefix[-1] == token:
                    # A repeat extends only from a blank; without one it merges into prefix.
                    extended[1] = _logaddexp(extended[1], p_blank + p)
                    same = scores[prefix]
                    same[1] = _logaddexp(same[1], p_label + p)
                else:
                    extended[1] = _logaddexp(extended[1], total + p)
        self._beams = {prefix: (s[0], s[1]) for prefix, s in scores.items()}
        ranked = sorted(self._beams, key=self._score, reverse=True)[: self.beam]
        self._beams = {prefix: self._beams[prefix] for prefix in ranked}
        if self.fusion is not None:
            self._words = {prefix: self._words[prefix] for prefix in ranked}


def ctc_prefix_beam_search(
    log_probs: np.ndarray,
    beam: int = 8,
    token_beam: int = 8,
    fusion: LmFusion | None = None,
    token_threshold: float = 8.0,
) -> list[int]:
    """The most probable label sequence of (T, V) log-probs by prefix beam search."""
    decoder = PrefixBeamDecoder(beam, token_beam, fusion, token_threshold)
    decoder.advance(log_probs)
    return decoder.ids
