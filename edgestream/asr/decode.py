"""Characters <-> CTC ids, and CTC decoding: greedy and prefix beam search.

The vocabulary is the transcript alphabet of `text.VOCAB` (a-z, apostrophe, space) after the
CTC blank (id 0). Both decoders take one utterance's log-probabilities (T, V) as a numpy array.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from edgestream.asr.text import VOCAB

BLANK = 0


class CharVocabulary:
    """Transcript characters as CTC ids 1..len(VOCAB); 0 is the blank."""

    def __init__(self, characters: str = VOCAB) -> None:
        self.characters = characters
        self._ids = {c: i + 1 for i, c in enumerate(characters)}

    def __len__(self) -> int:
        return len(self.characters) + 1

    def encode(self, text: str) -> list[int]:
        """>>> CharVocabulary().encode("ab c")
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
    """>>> ctc_greedy(np.log(np.array([[.1, .9, 0], [.1, .9, 0], [.9, .1, 0], [.1, .9, 0]]) + 1e-9))
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


class PrefixBeamDecoder:
    """Incremental CTC prefix beam search (Hannun et al., 2014), without a language model.

    Every prefix keeps two log-scores: ending in blank and ending in its last label, so that
    "a a" (with a blank between) and "a" (repeated frames) stay distinct. Per frame only the
    `token_beam` best tokens are expanded, then the `beam` best prefixes kept.
    """

    def __init__(self, beam: int = 8, token_beam: int = 8) -> None:
        if beam < 1 or token_beam < 1:
            raise ValueError(f"expected beam, token_beam >= 1, got {beam}, {token_beam}")
        self.beam, self.token_beam = beam, token_beam
        self._beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, -math.inf)}

    @property
    def ids(self) -> list[int]:
        """The best prefix so far."""
        return list(max(self._beams.items(), key=lambda kv: _logaddexp(*kv[1]))[0])

    def advance(self, log_probs: np.ndarray) -> None:
        for frame in log_probs:
            self._step(frame)

    def _step(self, frame: np.ndarray) -> None:
        candidates = np.argsort(frame)[::-1][: self.token_beam]
        scores: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [-math.inf, -math.inf])
        for prefix, (p_blank, p_label) in self._beams.items():
            total = _logaddexp(p_blank, p_label)
            for token in candidates.tolist():
                p = float(frame[token])
                if token == BLANK:
                    entry = scores[prefix]
                    entry[0] = _logaddexp(entry[0], total + p)
                    continue
                extended = scores[(*prefix, token)]
                if prefix and prefix[-1] == token:
                    # A repeat extends only from a blank; without one it merges into prefix.
                    extended[1] = _logaddexp(extended[1], p_blank + p)
                    same = scores[prefix]
                    same[1] = _logaddexp(same[1], p_label + p)
                else:
                    extended[1] = _logaddexp(extended[1], total + p)
        ranked = sorted(scores.items(), key=lambda kv: -_logaddexp(*kv[1]))[: self.beam]
        self._beams = {prefix: (s[0], s[1]) for prefix, s in ranked}


def ctc_prefix_beam_search(log_probs: np.ndarray, beam: int = 8, token_beam: int = 8) -> list[int]:
    """The most probable label sequence of (T, V) log-probs by prefix beam search."""
    decoder = PrefixBeamDecoder(beam, token_beam)
    decoder.advance(log_probs)
    return decoder.ids
