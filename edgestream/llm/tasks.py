"""Task prompts from the shared data, with the train/test split rule in code.

Categories follow the Speculative Streaming evaluations: dialogue and news summarisation,
German-to-English translation, context-grounded QA, grade-school maths, text-to-SQL, data-to-text
and open chat. Sources with an official split use it (GSM8K train/test, DialogSum dev/test, E2E
dev/test); the others are split by a hash of a stable key, 20% held back for testing, so the
same prompt always lands on the same side.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgestream.datasets import resolve_data_dir

CATEGORIES = ("dialogsum", "xsum", "translation", "qa", "gsm8k", "spider", "e2e", "chat")
SPLITS = ("train", "test")
MAX_SOURCE_CHARS = 1500  # long articles are cut so prompts stay a few hundred tokens


@dataclass(frozen=True)
class TaskPrompt:
    category: str
    key: str  # stable identifier within the category
    prompt: str  # the user message (the chat template is applied later)
    reference: str | None = None  # a gold answer where the source has one


def held_back(key: str, percent: int = 20) -> bool:
    """Whether a hash-split item belongs to the test side (stable across runs and machines)."""
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < percent


def _hash_split(key: str, split: str) -> bool:
    return held_back(key) == (split == "test")


def _clip(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_SOURCE_CHARS:
        return text
    cut = text[:MAX_SOURCE_CHARS]
    return cut[: cut.rfind(" ")] + " ..."


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def dialogsum(llm: Path, split: str) -> Iterator[TaskPrompt]:
    for row in _jsonl(llm / "dialogsum" / ("dev.jsonl" if split == "train" else "test.jsonl")):
        reference = row.get("summary") or row.get("summary1")
        instruction = "Summarize the following dialogue in one or two sentences."
        yield TaskPrompt(
            "dialogsum", row["fname"], f"{instruction}\n\n{_clip(row['dialogue'])}", reference
        )


def _bigbench(llm: Path, folder: str) -> list[dict]:
    return json.loads((llm / folder / "task.json").read_text())["examples"]


def xsum(llm: Path, split: str) -> Iterator[TaskPrompt]:
    for i, row in enumerate(_bigbench(llm, "xsum")):
        key = f"xsum-{i}"
        if _hash_split(key, split):
            text = _clip(row["input"])
            yield TaskPrompt(
                "xsum", key, f"Summarize this article in one sentence.\n\n{text}", row["target"]
            )


def translation(llm: Path, split: str) -> Iterator[TaskPrompt]:
    """German news sentences (MLSUM) to translate; the first two sentences of each article."""
    for i, row in enumerate(_bigbench(llm, "mlsum_de")):
        key = f"mlsum-{i}"
        if _hash_split(key, split):
            sentences = re.split(r"(?<=[.!?])\s+", row["input"].strip())
            text = _clip(" ".join(sentences[:2]))
            yield TaskPrompt("translation", key, f"Translate from German to English:\n\n{text}")


def qa(llm: Path, split: str) -> Iterator[TaskPrompt]:
    data = json.loads((llm / "squad" / "squaddev_v1.1.json").read_text())["data"]
    for article in data:
        if not _hash_split(article["title"], split):  # split by article: no shared contexts
            continue
        for paragraph in article["paragraphs"]:
            context = _clip(paragraph["context"])
            for qa_item in paragraph["qas"][:2]:
                yield TaskPrompt(
                    "qa",
                    qa_item["id"],
                    f"Answer the question using the context.\n\nContext: {context}\n\n"
                    f"Question: {qa_item['question']}",
                    qa_item["answers"][0]["text"],
                )


def gsm8k(llm: Path, split: str) -> Iterator[TaskPrompt]:
    for i, row in enumerate(_jsonl(llm / "gsm8k" / f"{split}.jsonl")):
        answer = row["answer"].rsplit("####", 1)[-1].strip()
        yield TaskPrompt("gsm8k", f"gsm8k-{split}-{i}", row["question"], answer)


def create_table_schema(table: dict) -> str:
    """Spider's schema record as CREATE TABLE statements, the context text-to-SQL models expect."""
    columns: dict[int, list[str]] = {}
    for (table_index, name), kind in zip(
        table["column_names_original"], table["column_types"], strict=False
    ):
        if table_index >= 0:
            columns.setdefault(table_index, []).append(f"{name} {kind}")
    return "\n".join(
        f"CREATE TABLE {name} ({', '.join(columns.get(i, []))});"
        for i, name in enumerate(table["table_names_original"])
    )


def spider(llm: Path, split: str) -> Iterator[TaskPrompt]:
    schemas = {
        t["db_id"]: create_table_schema(t)
        for t in json.loads((llm / "spider" / "tables.json").read_text())
    }
    for i, row in enumerate(json.loads((llm / "spider" / "dev.json").read_text())):
        if _hash_split(row["db_id"], split):  # split by database: test schemas are unseen
            yield TaskPrompt(
                "spider",
                f"spider-{i}",
                f"{schemas[row['db_id']]}\n\nWrite an SQL query for this question: "
                f"{row['question']}\nAnswer with the SQL query only.",
                row["query"],
            )


def e2e(llm: Path, split: str) -> Iterator[TaskPrompt]:
    name = "devset.csv" if split == "train" else "testset_w_refs.csv"
    seen: set[str] = set()
    with (llm / "e2e" / name).open(newline="") as f:
        for row in csv.DictReader(f):
            if row["mr"] in seen:  # several references per meaning representation
                continue
            seen.add(row["mr"])
            yield TaskPrompt(
                "e2e",
                row["mr"],
                "Write one sentence describing a restaurant with these attributes: " + row["mr"],
                row["ref"],
            )


_CHAT_TEMPLATES = (
    "Explain {} in simple terms.",
    "Give me three interesting facts about {}.",
    "Write a short poem about {}.",
    "What are the pros and cons of {}?",
    "How would you teach a child about {}?",
    "Write a short blog post introduction about {}.",
)
_CHAT_TOPICS = (
    "volcanoes",
    "the moon",
    "recycling",
    "bees",
    "electric cars",
    "coffee",
    "chess",
    "rainbows",
    "the internet",
    "sleep",
    "gardening",
    "the ocean",
    "music",
    "exercise",
    "trains",
    "bread",
    "clouds",
    "libraries",
    "bicycles",
    "friendship",
    "deserts",
    "robots",
    "photography",
    "tea",
    "mountains",
    "birds",
    "solar power",
    "cooking pasta",
    "learning a language",
    "time zones",
)


def chat(llm: Path, split: str) -> Iterator[TaskPrompt]:
    """Open chat prompts from templates over topics (no data file needed)."""
    del llm
    for template in _CHAT_TEMPLATES:
        for topic in _CHAT_TOPICS:
            key = f"{template}|{topic}"
            if _hash_split(key, split):
                yield TaskPrompt("chat", key, template.format(topic))


_READERS = {
    "dialogsum": dialogsum,
    "xsum": xsum,
    "translation": translation,
    "qa": qa,
    "gsm8k": gsm8k,
    "spider": spider,
    "e2e": e2e,
    "chat": chat,
}


def task_prompts(
    category: str, split: str, data_dir: str | Path | None = None, limit: int | None = None
) -> list[TaskPrompt]:
    """Prompts of one category and split, in a fixed order; at most `limit` of them."""
    if category not in _READERS:
        raise ValueError(f"unknown task {category!r}: expected one of {', '.join(CATEGORIES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    llm = resolve_data_dir(data_dir) / "llm"
    prompts = []
    for item in _READERS[category](llm, split):
        if limit is not None and len(prompts) >= limit:
            break
        prompts.append(item)
    return prompts


def task_mix(split: str, per_category: int, data_dir: str | Path | None = None) -> list[TaskPrompt]:
    """Up to `per_category` prompts of every category, categories interleaved."""
    groups = [task_prompts(c, split, data_dir, per_category) for c in CATEGORIES]
    mixed = []
    for i in range(max(len(g) for g in groups)):
        mixed.extend(g[i] for g in groups if i < len(g))
    return mixed
