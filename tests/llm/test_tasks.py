"""The task prompts' split rule and order: what trains must never be what the suite tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgestream.llm.tasks import CATEGORIES, _chat_requests, task_mix, task_prompts

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("EDGESTREAM_DATA", ROOT.parent / "shared" / "data"))
needs_data = pytest.mark.skipif(
    not (DATA / "llm").is_dir(), reason=f"shared data not found at {DATA} (set EDGESTREAM_DATA)"
)


def test_the_original_chat_requests_come_first() -> None:
    # Benchmarks and the bundled streams were made with these 180 in this order; later waves
    # must only append, or the suite's chat prompts would change under old results.
    requests = [prompt for _, prompt in _chat_requests()]
    assert requests[0] == "Explain volcanoes in simple terms."
    assert requests[179] == "Write a short blog post introduction about time zones."
    assert len(set(requests)) == len(requests) > 180
    assert any(prompt.startswith("Write a Python function") for prompt in requests)


@needs_data
@pytest.mark.parametrize("category", CATEGORIES)
def test_no_prompt_is_on_both_sides_of_the_split(category: str) -> None:
    train = task_prompts(category, "train", DATA)
    test = task_prompts(category, "test", DATA)
    assert train and test
    assert not {p.key for p in train} & {p.key for p in test}
    assert not {p.prompt for p in train} & {p.prompt for p in test}


@needs_data
def test_the_suites_first_chat_prompts_are_unchanged() -> None:
    # The first test prompts of a category make `bench spec --suite tasks`.
    first = [p.prompt for p in task_prompts("chat", "test", DATA, limit=4)]
    assert first == [
        "Explain electric cars in simple terms.",
        "Explain the internet in simple terms.",
        "Explain sleep in simple terms.",
        "Explain the ocean in simple terms.",
    ]


@needs_data
def test_open_questions_are_ones_the_qa_task_never_asks() -> None:
    for split in ("train", "test"):
        qa_ids = {p.key for p in task_prompts("qa", split, DATA)}
        open_ids = {
            p.key.removeprefix("open-")
            for p in task_prompts("chat", split, DATA)
            if p.key.startswith("open-")
        }
        assert open_ids and not open_ids & qa_ids
    # Split by article as the QA task is: a test article's question never trains as chat.
    test_qa = {p.key for p in task_prompts("qa", "test", DATA)}
    train_open = {p.key.removeprefix("open-") for p in task_prompts("chat", "train", DATA)}
    assert not test_qa & train_open


@needs_data
def test_skipping_gives_what_a_larger_mix_adds() -> None:
    small = task_mix("train", 3, DATA)
    rest = task_mix("train", 2, DATA, skip=3)
    larger = task_mix("train", 5, DATA)
    for category in CATEGORIES:
        own = [p.key for p in larger if p.category == category]
        assert [p.key for p in small if p.category == category] == own[:3]
        assert [p.key for p in rest if p.category == category] == own[3:]


@needs_data
def test_a_negative_skip_is_refused() -> None:
    with pytest.raises(ValueError, match="skip >= 0"):
        task_prompts("chat", "train", DATA, skip=-1)


@needs_data
def test_the_chat_probe_is_held_back_and_unchanged() -> None:
    from edgestream.bench.spec import CHAT_PROBE_KINDS, chat_probe

    probe = chat_probe(DATA, per_kind=8)
    # Published chat-probe results (docs/bench-spec-streams-run4.json) were made on these.
    assert len(probe) == 21
    assert [p.category for p in probe] == ["request"] * 8 + ["coding"] * 5 + ["open-question"] * 8
    assert probe[0].turns == ("Give me three interesting facts about bees.",)
    assert set(CHAT_PROBE_KINDS) == {p.category for p in probe}
    texts = {p.turns[0] for p in probe}
    train = {p.prompt for p in task_prompts("chat", "train", DATA)}
    suite = {p.prompt for p in task_prompts("chat", "test", DATA, limit=8)}
    assert len(texts) == 21 and not texts & train and not texts & suite
    with pytest.raises(ValueError, match="at least one"):
        chat_probe(DATA, per_kind=0)
