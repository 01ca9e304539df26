"""Word n-gram language model for CTC beam search: Kneser-Ney estimation, ARPA in and out.

The model is a standard back-off n-gram in ARPA format, so an LM built elsewhere (KenLM's
`lmplz`, SRILM) on other text drops in unchanged. `train_ngram` builds one from sentences
(interpolated Kneser-Ney, Chen & Goodman 1998, one discount per order from the count-of-counts)
and writes it with the usual conversion: a seen n-gram stores its interpolated probability, a
context stores the back-off weight that renormalises the rest. Count cut-offs on the highest
orders keep the file small; the back-off weights are computed after pruning, so every
context's distribution still sums to one (tested).

Scores are natural logs; ARPA files hold log10.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
LN10 = math.log(10.0)
BUNDLED_LM = Path(__file__).parent / "weights" / "words-3gram.arpa.gz"
# The prefix beam width decoding uses with an LM: dev WER 9.2% at 16, 8.9% at 32 (docs/asr.md)
LM_BEAM = 32
CACHE_LIMIT = 200_000  # scored n-grams kept for reuse (~40 MB at most)


class NgramLm:
    """A back-off n-gram model: `log_prob(context, word)` in natural log."""

    def __init__(
        self,
        order: int,
        probs: dict[tuple[str, ...], float],
        backoffs: dict[tuple[str, ...], float],
    ) -> None:
        # probs: n-gram -> log10 p(last | rest); backoffs: context -> log10 back-off weight.
        if order < 1 or (UNK,) not in probs:
            raise ValueError("expected an n-gram model of order >= 1 with an <unk> unigram")
        self.order, self._probs, self._backoffs = order, probs, backoffs
        self._cache: dict[tuple[str, ...], float] = {}
        self._prefixes: frozenset[str] | None = None

    @property
    def size(self) -> int:
        """Number of n-grams stored."""
        return len(self._probs)

    def __contains__(self, word: str) -> bool:
        return (word,) in self._probs

    def starts_a_word(self, text: str) -> bool:
        """Whether some word of the model begins with `text`."""
        if self._prefixes is None:
            words = (ngram[0] for ngram in self._probs if len(ngram) == 1)
            self._prefixes = frozenset(w[:i] for w in words for i in range(1, len(w) + 1))
        return text in self._prefixes

    def log_prob(self, context: tuple[str, ...], word: str) -> float:
        """ln p(word | context); `context` is the preceding words (BOS first at a start),
        of which only the last order - 1 count. Unknown words score as <unk>."""
        kept = context[-(self.order - 1) :] if self.order > 1 else ()
        key = (*kept, word if word in self else UNK)
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) >= CACHE_LIMIT:  # bounded: a stream may last for hours
                self._cache.clear()
            cached = self._cache[key] = self._log10(key) * LN10
        return cached

    def _log10(self, ngram: tuple[str, ...]) -> float:
        backoff = 0.0
        while ngram not in self._probs:
            backoff += self._backoffs.get(ngram[:-1], 0.0)
            ngram = ngram[1:]
        return backoff + self._probs[ngram]

    @classmethod
    def from_arpa(cls, path: str | Path) -> NgramLm:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"language model {path} does not exist")
        opener = gzip.open if path.suffix == ".gz" else open
        probs: dict[tuple[str, ...], float] = {}
        backoffs: dict[tuple[str, ...], float] = {}
        order, section = 0, 0
        try:
            with opener(path, "rt", encoding="utf-8") as lines:
                for line in lines:
                    line = line.strip()
                    if not line or line.startswith("ngram ") or line == "\\data\\":
                        continue
                    if line.endswith("-grams:"):
                        section = int(line[1:].split("-")[0])
                        order = max(order, section)
                        continue
                    if line == "\\end\\":
                        break
                    fields = line.split()
                    if section < 1 or len(fields) < section + 1:
                        raise ValueError(f"unexpected line {line[:60]!r}")
                    ngram = tuple(map(sys.intern, fields[1 : section + 1]))
                    probs[ngram] = float(fields[0])
                    if len(fields) > section + 1:
                        backoffs[ngram] = float(fields[section + 1])
        except (OSError, UnicodeDecodeError, ValueError, EOFError) as error:
            raise ValueError(f"{path} is not a readable ARPA language model: {error}") from None
        return cls(order, probs, backoffs)


def _count(sentences: Iterable[str], order: int) -> list[Counter[tuple[str, ...]]]:
    counts: list[Counter[tuple[str, ...]]] = [Counter() for _ in range(order)]
    for sentence in sentences:
        words = [BOS, *sentence.split(), EOS]
        for n in range(1, order + 1):
            top = counts[n - 1]
            for i in range(len(words) - n + 1):
                top[tuple(words[i : i + n])] += 1
    return counts


def _discount(counts: Counter[tuple[str, ...]]) -> float:
    """Ney's estimate D = n1 / (n1 + 2 n2) from the count-of-counts."""
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5


def train_ngram(
    sentences: Iterable[str], order: int = 3, min_counts: tuple[int, ...] = (1, 1, 2)
) -> NgramLm:
    """Interpolated Kneser-Ney n-gram of whitespace-separated `sentences`.

    min_counts[n-1]: n-grams seen fewer times are pruned (their mass backs off); it applies to
    the raw counts of the highest order and to the continuation counts below it.
    """
    if order < 1 or len(min_counts) < order:
        raise ValueError(f"expected order >= 1 and a min count per order, got {order}")
    raw = _count(sentences, order)
    if not raw[0]:
        raise ValueError("no words to train a language model on")
    # Kneser-Ney: below the top order, count the distinct words seen before an n-gram.
    counts: list[Counter[tuple[str, ...]]] = [Counter() for _ in range(order)]
    counts[order - 1] = raw[order - 1]
    for n in range(1, order):
        continuation: Counter[tuple[str, ...]] = Counter()
        for ngram in raw[n]:
            continuation[ngram[1:]] += 1
        for ngram, c in raw[n - 1].items():  # n-grams at a sentence start have no left word
            if ngram[0] == BOS:
                continuation[ngram] = c
        counts[n - 1] = continuation
    counts[0].pop((BOS,), None)

    vocabulary = [w for (w,) in counts[0]]
    log10 = math.log10
    probs: dict[tuple[str, ...], float] = {}
    backoffs: dict[tuple[str, ...], float] = {}
    # Unigrams: discounted continuation counts, the reserved mass spread uniformly
    # over the vocabulary and <unk>.
    d = _discount(counts[0])
    total = sum(counts[0].values())
    reserved = d * len(vocabulary) / total
    uniform = 1.0 / (len(vocabulary) + 1)
    lower: dict[tuple[str, ...], float] = {}
    for (w,), c in counts[0].items():
        lower[(w,)] = (c - d) / total + reserved * uniform
    lower[(UNK,)] = reserved * uniform
    lower[(BOS,)] = 0.0
    for ngram, p in lower.items():
        probs[ngram] = log10(p) if p > 0 else -99.0

    for n in range(2, order + 1):
        d = _discount(counts[n - 1])
        by_context: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
        for ngram, c in counts[n - 1].items():
            by_context[ngram[:-1]].append((ngram[-1], c))
        current: dict[tuple[str, ...], float] = {}
        for context, followers in by_context.items():
            context_total = sum(c for _, c in followers)
            gamma = d * len(followers) / context_total
            kept_p = kept_lower = 0.0
            for w, c in followers:
                p_lower = _interpolated(lower, probs, backoffs, (*context[1:], w))
                p = max(c - d, 0.0) / context_total + gamma * p_lower
                current[(*context, w)] = p
                if c >= min_counts[n - 1]:
                    probs[(*context, w)] = log10(p)
                    kept_p += p
                    kept_lower += p_lower
                else:
                    del current[(*context, w)]
            # After pruning: the back-off weight that makes p(. | context) sum to one.
            if kept_p > 0 or gamma > 0:
                backoffs[context] = log10(max(1.0 - kept_p, 1e-12) / max(1.0 - kept_lower, 1e-12))
        lower = current
    return NgramLm(order, probs, backoffs)


def _interpolated(
    lower: dict[tuple[str, ...], float],
    probs: dict[tuple[str, ...], float],
    backoffs: dict[tuple[str, ...], float],
    ngram: tuple[str, ...],
) -> float:
    """p of a lower-order n-gram as stored so far (pruned entries back off)."""
    if ngram in lower:
        return lower[ngram]
    log = 0.0
    while ngram not in probs:
        log += backoffs.get(ngram[:-1], 0.0)
        ngram = ngram[1:]
    return 10.0 ** (log + probs[ngram])


def write_arpa(lm: NgramLm, path: str | Path) -> None:
    """Write `lm` as ARPA (gzip-compressed when the name ends in .gz), atomically."""
    path = Path(path)
    by_order: list[list[tuple[str, ...]]] = [[] for _ in range(lm.order)]
    for ngram in lm._probs:
        by_order[len(ngram) - 1].append(ngram)
    text = io.StringIO()
    text.write("\\data\\\n")
    for n, ngrams in enumerate(by_order, 1):
        text.write(f"ngram {n}={len(ngrams)}\n")
    for n, ngrams in enumerate(by_order, 1):
        text.write(f"\n\\{n}-grams:\n")
        for ngram in sorted(ngrams):
            line = f"{lm._probs[ngram]:.6f}\t{' '.join(ngram)}"
            if n < lm.order and ngram in lm._backoffs:
                line += f"\t{lm._backoffs[ngram]:.6f}"
            text.write(line + "\n")
    text.write("\n\\end\\\n")
    temporary = path.with_name(f".{path.name}.tmp")
    data = text.getvalue().encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    temporary.write_bytes(data)
    os.replace(temporary, path)


def load_lm(name: str | Path) -> NgramLm | None:
    """'default' (the bundled LM), 'none' (None), or an ARPA file (.arpa or .arpa.gz)."""
    if str(name) == "none":
        return None
    return NgramLm.from_arpa(BUNDLED_LM if str(name) == "default" else Path(name))
