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
import itertools
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
    """German news sentences (MLSUM) to translate; the first two sentences of each article.

    MLSUM repeats a few articles under other indices, so a test prompt whose text also falls
    on the train side is dropped (one of 402): a test prompt is never one that trained."""
    prompts = {"train": [], "test": []}
    for i, row in enumerate(_bigbench(llm, "mlsum_de")):
        key = f"mlsum-{i}"
        sentences = re.split(r"(?<=[.!?])\s+", row["input"].strip())
        text = _clip(" ".join(sentences[:2]))
        side = "test" if held_back(key) else "train"
        prompts[side].append(
            TaskPrompt("translation", key, f"Translate from German to English:\n\n{text}")
        )
    if split == "train":
        yield from prompts["train"]
    else:
        trained = {p.prompt for p in prompts["train"]}
        yield from (p for p in prompts["test"] if p.prompt not in trained)


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
# A second wave: the kinds of request an assistant meets beyond explanations
# (writing, role-play, advice, comparison, reasoning), over more topics. It comes after the
# first in every split, so the first prompts of each split, which the task suite uses, stay.
_MORE_CHAT_TEMPLATES = (
    "Write a short story about {}.",
    "Write an email to a friend telling them about {}.",
    "Summarize the history of {} in one paragraph.",
    "Imagine you are a tour guide. Introduce {} to a group of visitors.",
    "What is a common misconception about {}, and what is the truth?",
    "Compare {} with something similar and explain the main differences.",
    "Give step-by-step advice to a beginner who wants to learn about {}.",
    "List five questions a student might ask about {}, each with a short answer.",
    "Describe {} to someone who has never heard of it.",
    "Write a persuasive paragraph arguing that {} deserves more attention.",
)
_MORE_CHAT_TOPICS = (
    "black holes",
    "the printing press",
    "vaccines",
    "the Roman Empire",
    "climate change",
    "honeybees and pollination",
    "the stock market",
    "jazz",
    "public transport",
    "renewable energy",
    "the human heart",
    "dinosaurs",
    "smartphones",
    "the Great Wall of China",
    "meditation",
    "origami",
    "earthquakes",
    "the water cycle",
    "ancient Egypt",
    "artificial intelligence",
    "healthy breakfast",
    "volunteering",
    "the Olympic Games",
    "saving money",
    "camping",
    "the French Revolution",
    "plate tectonics",
    "coral reefs",
    "video games",
    "remote work",
    "the periodic table",
    "Shakespeare",
    "electric guitars",
    "rain forests",
    "space travel",
    "chocolate",
    "the immune system",
    "public speaking",
    "board games",
    "the Industrial Revolution",
)
# Small programming requests (the suite's own coding is SQL only).
_CODING_TASKS = (
    "reverses a string",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number",
    "counts the vowels in a sentence",
    "finds the largest number in a list",
    "removes duplicates from a list while keeping the order",
    "checks whether a word is a palindrome",
    "converts Celsius to Fahrenheit",
    "merges two sorted lists",
    "counts how often each word occurs in a text",
    "computes the factorial of a number",
    "sorts a list of names by their length",
    "returns the sum of the digits of a number",
    "checks whether two words are anagrams",
    "flattens a list of lists",
    "finds the second smallest number in a list",
    "capitalizes the first letter of every word",
    "computes the average of a list of numbers",
    "tells whether a year is a leap year",
    "converts a number to binary",
    "finds the common elements of two lists",
    "returns the longest word in a sentence",
    "validates a simple email address",
    "rotates a list by k positions",
    "computes the greatest common divisor of two numbers",
    "counts the lines in a text file",
    "splits a list into chunks of size n",
    "checks whether brackets in a string are balanced",
    "returns the prime factors of a number",
    "transposes a matrix given as a list of lists",
)


def _chat_requests() -> Iterator[tuple[str, str]]:
    """(key, prompt) for every templated request, the original 180 first."""
    for template in _CHAT_TEMPLATES:
        for topic in _CHAT_TOPICS:
            yield f"{template}|{topic}", template.format(topic)
    for template in _CHAT_TEMPLATES:
        for topic in _MORE_CHAT_TOPICS:
            yield f"{template}|{topic}", template.format(topic)
    for template in _MORE_CHAT_TEMPLATES:
        for topic in _CHAT_TOPICS + _MORE_CHAT_TOPICS:
            yield f"{template}|{topic}", template.format(topic)
    for task in _CODING_TASKS:
        yield f"code|{task}", f"Write a Python function that {task}, and explain how it works."


def _open_questions(llm: Path, split: str) -> Iterator[TaskPrompt]:
    """SQuAD questions asked without their context, as a user would ask an assistant. Only
    questions the QA task never uses (it takes the first two per paragraph), split by article
    as the QA task is, so no test article's questions train."""
    data = json.loads((llm / "squad" / "squaddev_v1.1.json").read_text())["data"]
    for article in data:
        if not _hash_split(article["title"], split):
            continue
        for paragraph in article["paragraphs"]:
            for qa_item in paragraph["qas"][2:3]:
                yield TaskPrompt("chat", f"open-{qa_item['id']}", qa_item["question"])


def chat(llm: Path, split: str) -> Iterator[TaskPrompt]:
    """Open chat: templated requests over topics, then questions asked without context."""
    for key, prompt in _chat_requests():
        if _hash_split(key, split):
            yield TaskPrompt("chat", key, prompt)
    yield from _open_questions(llm, split)


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
    category: str,
    split: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    skip: int = 0,
) -> list[TaskPrompt]:
    """Prompts of one category and split, in a fixed order: at most `limit` of them, after
    the first `skip`."""
    if category not in _READERS:
        raise ValueError(f"unknown task {category!r}: expected one of {', '.join(CATEGORIES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    if skip < 0:
        raise ValueError(f"expected skip >= 0, got {skip}")
    llm = resolve_data_dir(data_dir) / "llm"
    stop = None if limit is None else skip + limit
    return list(itertools.islice(_READERS[category](llm, split), skip, stop))


def task_mix(
    split: str, per_category: int, data_dir: str | Path | None = None, skip: int = 0
) -> list[TaskPrompt]:
    """Up to `per_category` prompts of every category (after its first `skip`: the prompts a
    mix of `skip` per category already held), categories interleaved."""
    groups = [task_prompts(c, split, data_dir, per_category, skip) for c in CATEGORIES]
    mixed = []
    for i in range(max(len(g) for g in groups)):
        mixed.extend(g[i] for g in groups if i < len(g))
    return mixed
