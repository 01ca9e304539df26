"""Speakable sentences for synthetic speech, cleaned out of the shared text data.

Every English source under `DATA/llm` (GSM8K, DialogSum, E2E, Spider, XSum, SQuAD) is split
into sentences, each normalised to the transcript alphabet `VOCAB` (lower-case a-z, apostrophe,
space) with numbers spelled out, or dropped when that cannot be done unambiguously (acronyms,
formulas, code, letters outside a-z). `mlsum_de` is skipped: it is German and every voice here
is English.

The normalised sentence is both what the synthesiser speaks and the transcript, so audio and
label agree by construction. Its train/dev/test split is a pure function of the normalised text
(`split_of`), so the test sentences never change with the seed and are never trained on.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgestream.datasets import resolve_data_dir

VOCAB = "abcdefghijklmnopqrstuvwxyz' "  # every character a transcript may contain
SOURCES = ("gsm8k", "dialogsum", "e2e", "spider", "xsum", "squad")  # English sources in llm/

_ONES = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_FRACTION_DENOMINATORS = {2: ("half", "halves"), 4: ("quarter", "quarters")}
_CURRENCIES = {"$": ("dollar", "cent"), "£": ("pound", "penny"), "€": ("euro", "cent")}
_SCALE_SUFFIXES = {
    "m": "million",
    "million": "million",
    "bn": "billion",
    "billion": "billion",
    "k": "thousand",
    "thousand": "thousand",
    "trillion": "trillion",
}
# Titles are expanded before sentence splitting, since "Mr. Smith" is no sentence end.
_TITLES = (
    (r"\bMrs\.", "Missus"),
    (r"\bMr\.", "Mister"),
    (r"\bMs\.", "Miss"),
    (r"\bDr\.", "Doctor"),
)
_ABBREVIATIONS = (
    (r"\bvs\.", "versus"),
    (r"\be\.g\.", "for example"),
    (r"\bi\.e\.", "that is"),
    (r"\betc\.", "et cetera"),
    (r"&", " and "),
)
_PUNCTUATION = re.compile(r"[\s,.;:!?\"()\[\]\-–—]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_ACRONYM = re.compile(r"\b(?:[A-Z]{2,}|[A-Z]\.[A-Z])")  # "NFL", "U.S.": letters or a word?
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"


def spell_number(n: int) -> str:
    """Cardinal number in words, American style without "and" (`1205` -> `one thousand two
    hundred five`); negative numbers get "minus"."""
    if n < 0:
        return "minus " + spell_number(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " " + spell_number(rest))
    for value, name in _SCALES:
        if n >= value:
            high, rest = divmod(n, value)
            return spell_number(high) + " " + name + ("" if rest == 0 else " " + spell_number(rest))
    raise AssertionError("unreachable: every n >= 1000 has a scale")


def spell_ordinal(n: int) -> str:
    """Ordinal number in words: `1` -> `first`, `22` -> `twenty second`, `100` -> `one
    hundredth`."""
    if n < 0:
        raise ValueError(f"ordinal of a negative number: expected n >= 0, got {n}")
    words = spell_number(n).split()
    last = words[-1]
    if last in _ORDINAL_WORDS:
        words[-1] = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def spell_year(n: int) -> str:
    """A year as spoken: `1996` -> `nineteen ninety six`, `2005` -> `two thousand five`,
    `2015` -> `twenty fifteen`, `1900` -> `nineteen hundred`."""
    high, low = divmod(n, 100)
    if n % 1000 < 10 or not 1000 <= n <= 9999:  # 2000-2009, 1000-1009: read as a cardinal
        return spell_number(n)
    if low == 0:
        return spell_number(high) + " hundred"
    return spell_number(high) + (" oh " if low < 10 else " ") + spell_number(low)


def _spell_decimal(text: str) -> str:
    """`"12.05"` -> `twelve point zero five` (digits after the point one by one)."""
    whole, _, frac = text.replace(",", "").partition(".")
    words = spell_number(int(whole))
    return words + (" point " + " ".join(_ONES[int(d)] for d in frac) if frac else "")


def _spell_money(match: re.Match[str]) -> str:
    unit, subunit = _CURRENCIES[match["cur"]]
    amount, scale = match["num"].replace(",", ""), match["scale"]
    whole, _, cents = amount.partition(".")
    if scale:
        return f" {_spell_decimal(amount)} {_SCALE_SUFFIXES[scale.lower()]} {unit}s "
    unit_words = f"{spell_number(int(whole))} {unit}{'' if whole == '1' else 's'}"
    if len(cents) == 2 and int(cents) > 0:
        plural = "pence" if subunit == "penny" else subunit + "s"
        cent_words = f"{spell_number(int(cents))} {subunit if cents == '01' else plural}"
        return f" {unit_words} and {cent_words} "
    if cents.strip("0"):
        return f" {_spell_decimal(amount)} {unit}s "
    return f" {unit_words} "


def _spell_time(match: re.Match[str]) -> str:
    hour, minute = int(match["h"]), int(match["m"])
    if hour > 24 or minute > 59:
        return match[0]  # not a time: left for the digit check to reject
    if minute == 0:
        words = spell_number(hour) + " o'clock"
    else:
        words = spell_number(hour) + (" oh " if minute < 10 else " ") + spell_number(minute)
    meridiem = match["ampm"]
    return f" {words} {meridiem[0].lower()} m " if meridiem else f" {words} "


def _spell_fraction(match: re.Match[str]) -> str:
    top, bottom = int(match["top"]), int(match["bottom"])
    if not 2 <= bottom <= 10 or top == 0 or top >= 100:
        return match[0]  # a ratio or date, not a spoken fraction: rejected later by "/"
    singular, plural = _FRACTION_DENOMINATORS.get(bottom, (spell_ordinal(bottom),) * 2)
    if bottom not in _FRACTION_DENOMINATORS:
        plural = singular + "s"
    return f" {spell_number(top)} {singular if top == 1 else plural} "


def _spell_integer(match: re.Match[str]) -> str:
    text = match[0]
    if "," not in text and len(text) == 4 and 1100 <= int(text) <= 2099:
        return f" {spell_year(int(text))} "
    return f" {spell_number(int(text.replace(',', '')))} "


def _expand_numbers(text: str) -> str:
    """Numbers, money, percentages, ordinals, times and simple fractions into words."""
    text = re.sub(
        rf"(?P<cur>[$£€])\s?(?P<num>{_NUMBER})(?:\s?(?P<scale>million|billion|trillion|thousand"
        r"|bn|m|k)\b)?",
        _spell_money,
        text,
        flags=re.IGNORECASE,
    )
    text = re.sub(rf"({_NUMBER})\s?%", lambda m: f" {_spell_decimal(m[1])} percent ", text)
    text = re.sub(r"\b(\d+)(?:st|nd|rd|th)\b", lambda m: f" {spell_ordinal(int(m[1]))} ", text)
    text = re.sub(
        r"\b(?P<h>\d{1,2}):(?P<m>\d{2})(?:\s?(?P<ampm>[ap])\.?m\b\.?)?",
        _spell_time,
        text,
        flags=re.IGNORECASE,
    )
    text = re.sub(r"\b(?P<top>\d+)/(?P<bottom>\d+)\b", _spell_fraction, text)
    text = re.sub(r"\b(\d+(?:,\d{3})*)\s?[-–]\s?(\d+(?:,\d{3})*)\b", r"\1 to \2", text)
    text = re.sub(r"\b\d+(?:,\d{3})*\.\d+\b", lambda m: f" {_spell_decimal(m[0])} ", text)
    return re.sub(r"\b\d+(?:,\d{3})*\b", _spell_integer, text)


def _ascii_fold(text: str) -> str:
    """Typographic quotes and ellipses to ASCII; accents stripped (`café` -> `cafe`)."""
    text = text.translate(str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "…": "."}))
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def normalize_sentence(raw: str, min_words: int = 3, max_words: int = 25) -> str | None:
    """One raw sentence as a transcript over `VOCAB`, or None when it cannot be spoken
    unambiguously or its word count is outside [min_words, max_words].

    >>> normalize_sentence("Weng earns $12 an hour; she worked 50 minutes.")
    'weng earns twelve dollars an hour she worked fifty minutes'
    >>> normalize_sentence("The NFL final was in 2016.") is None  # acronym: spoken how?
    True
    """
    text = _ascii_fold(raw)
    text = re.sub(r"(\w) ' ?(s|t|ve|re|ll|d|m)\b", r"\1'\2", text, flags=re.IGNORECASE)
    for pattern, replacement in _TITLES + _ABBREVIATIONS:
        text = re.sub(pattern, replacement, text)
    text = _expand_numbers(text)  # before the acronym check: it consumes "PM" and "M" ($5M)
    if _ACRONYM.search(text):
        return None
    text = _PUNCTUATION.sub(" ", text).lower()
    # Apostrophes only inside words ("don't"); quoting apostrophes are not spoken.
    text = re.sub(r"(?<![a-z])'|'(?![a-z])", " ", text)
    words = text.split()
    if not min_words <= len(words) <= max_words:
        return None
    sentence = " ".join(words)
    return sentence if set(sentence) <= set(VOCAB) else None


def split_sentences(text: str) -> list[str]:
    """Split running text at sentence ends (., !, ? before a capital or digit) and newlines."""
    for pattern, replacement in _TITLES:
        text = re.sub(pattern, replacement, text)
    return [part.strip() for part in _SENTENCE_END.split(text) if part and part.strip()]


def _jsonl(path: Path) -> Iterator[dict[str, object]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _source_texts(llm_dir: Path, source: str) -> Iterator[str]:
    """Raw text blocks of one source, in file order."""
    folder = llm_dir / source
    if source == "gsm8k":
        for name in ("train.jsonl", "test.jsonl"):
            for row in _jsonl(folder / name):
                yield str(row["question"])
                yield re.sub(r"<<[^>]*>>", "", str(row["answer"]))  # calculator annotations
    elif source == "dialogsum":
        for name in ("dev.jsonl", "test.jsonl"):
            for row in _jsonl(folder / name):
                yield re.sub(r"#Person\d#:", "\n", str(row["dialogue"]))
    elif source == "e2e":
        for name in ("devset.csv", "testset_w_refs.csv"):
            with (folder / name).open(encoding="utf-8", newline="") as rows:
                yield from (row["ref"] for row in csv.DictReader(rows))
    elif source == "spider":
        yield from (q["question"] for q in json.loads((folder / "dev.json").read_text("utf-8")))
    elif source == "xsum":
        task = json.loads((folder / "task.json").read_text("utf-8"))
        for example in task["examples"]:
            yield example["input"]
            yield example["target"]
    elif source == "squad":
        squad = json.loads((folder / "squaddev_v1.1.json").read_text("utf-8"))
        for article in squad["data"]:
            for paragraph in article["paragraphs"]:
                yield paragraph["context"]
                yield from (qa["question"] for qa in paragraph["qas"])
    else:
        raise ValueError(f"unknown text source {source!r}: expected one of {', '.join(SOURCES)}")


def extract_sentences(
    data_dir: str | Path | None = None,
    sources: Iterable[str] = SOURCES,
    min_words: int = 3,
    max_words: int = 25,
) -> list[str]:
    """Distinct normalised sentences from `sources` under `data_dir/llm`, sorted (so the result
    does not depend on file order)."""
    llm_dir = resolve_data_dir(data_dir) / "llm"
    found: set[str] = set()
    for source in sources:
        for block in _source_texts(llm_dir, source):
            for raw in split_sentences(block):
                sentence = normalize_sentence(raw, min_words, max_words)
                if sentence is not None:
                    found.add(sentence)
    return sorted(found)


def lm_sentences(data_dir: str | Path | None = None, sources: Iterable[str] = SOURCES) -> list[str]:
    """The train split's sentences of every length, for the word LM.

    `asr synth` speaks only sentences of 3-25 words, but the longer and shorter ones carry
    words the test sentences use: with them the LM knows 35.5k words instead of 29.7k, and a
    quarter of the test words the smaller LM missed (measured, stop 27). A dev or test
    sentence is left out by the same hash `load_splits` uses, so none is ever in the LM.
    """
    sentences = extract_sentences(data_dir, sources, min_words=1, max_words=10_000)
    return [s for s in sentences if split_of(s) == "train"]


def text_sentences(path: str | Path) -> list[str]:
    """The sentences of a UTF-8 text file, normalised like transcripts, of any length."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such text file: {path}")
    try:
        text = path.read_text("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    sentences = []
    for line in text.splitlines():
        for raw in split_sentences(line):
            sentence = normalize_sentence(raw, min_words=1, max_words=10_000)
            if sentence is not None:
                sentences.append(sentence)
    if not sentences:
        raise ValueError(f"{path} has no sentences to learn from")
    return sentences


def split_of(sentence: str, dev_fraction: float = 0.03, test_fraction: float = 0.05) -> str:
    """`"train"`, `"dev"` or `"test"` for a normalised sentence, from a hash of its text alone.

    The same sentence always lands in the same split, whatever the seed or the sources.
    """
    if dev_fraction < 0 or test_fraction < 0 or dev_fraction + test_fraction >= 1:
        raise ValueError(
            f"expected dev_fraction, test_fraction >= 0 summing below 1, "
            f"got {dev_fraction} and {test_fraction}"
        )
    digest = hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest()
    position = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
    if position < test_fraction:
        return "test"
    return "dev" if position < test_fraction + dev_fraction else "train"


@dataclass(frozen=True)
class SentenceSplits:
    """Disjoint sentence lists for each split, each sorted."""

    train: tuple[str, ...]
    dev: tuple[str, ...]
    test: tuple[str, ...]

    def get(self, split: str) -> tuple[str, ...]:
        if split not in ("train", "dev", "test"):
            raise ValueError(f"unknown split {split!r}: expected train, dev or test")
        return getattr(self, split)


def load_splits(
    data_dir: str | Path | None = None,
    sources: Iterable[str] = SOURCES,
    dev_fraction: float = 0.03,
    test_fraction: float = 0.05,
) -> SentenceSplits:
    """All speakable sentences of `sources`, divided by `split_of`."""
    parts: dict[str, list[str]] = {"train": [], "dev": [], "test": []}
    for sentence in extract_sentences(data_dir, sources):
        parts[split_of(sentence, dev_fraction, test_fraction)].append(sentence)
    return SentenceSplits(tuple(parts["train"]), tuple(parts["dev"]), tuple(parts["test"]))


def write_splits(splits: SentenceSplits, path: str | Path) -> None:
    """The sentences as gzipped JSON, `{"train": [...], "dev": [...], "test": [...]}`, so a
    machine without the task data (a lent accelerator) synthesises from the same ones."""
    payload = {split: list(splits.get(split)) for split in ("train", "dev", "test")}
    Path(path).write_bytes(gzip.compress(json.dumps(payload).encode("utf-8"), mtime=0))


def read_splits(path: str | Path) -> SentenceSplits:
    """What `write_splits` wrote; a clear error for anything else."""
    try:
        payload = json.loads(gzip.decompress(Path(path).read_bytes()))
        return SentenceSplits(*(tuple(payload[s]) for s in ("train", "dev", "test")))
    except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a sentences file ({error})") from error
