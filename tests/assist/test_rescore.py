from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgestream.assist.rescore import LlmRescorer
from edgestream.llm.loading import load_language_model
from edgestream.llm.score import text_log_probs

CANDIDATES = [("the cat sat", -10.0), ("a dog ran to the park", -10.5), ("the cats at", -11.0)]


@pytest.fixture(scope="module")
def lm(tiny_model_dir: Path) -> object:
    return load_language_model(str(tiny_model_dir))


def test_the_choice_maximises_first_pass_plus_weighted_llm_score(lm: object) -> None:
    texts = [text for text, _ in CANDIDATES]
    llm = text_log_probs(lm, texts)
    for weight, bonus in [(0.0, 0.0), (0.5, 0.0), (1.0, 2.0), (100.0, 0.0)]:
        totals = [
            first + weight * score + bonus * len(text.split())
            for (text, first), score in zip(CANDIDATES, llm, strict=True)
        ]
        expected = texts[totals.index(max(totals))]
        assert LlmRescorer(lm, weight, bonus)(CANDIDATES) == expected
        assert LlmRescorer(lm, weight, bonus, skip_margin=0.4)(CANDIDATES) == "the cat sat"
    # weight 0 keeps the first pass's best; a huge weight, the language model's favourite
    assert LlmRescorer(lm, 0.0, 0.0)(CANDIDATES) == "the cat sat"
    assert LlmRescorer(lm, 100.0, 0.0)(CANDIDATES) == texts[llm.index(max(llm))]


def test_a_single_or_clear_winner_is_kept_without_scoring(lm: object) -> None:
    unasked = LlmRescorer(lm)
    object.__setattr__(unasked, "lm", None)  # any use of the model would now fail
    assert unasked([("only one", -3.0)]) == "only one"
    assert unasked([("clear", -3.0), ("far behind", -7.5)]) == "clear"


def test_transcribe_rescores_with_a_language_model_and_refuses_greedy(
    tiny_model_dir: Path, spoken_questions: list[Path]
) -> None:
    from typer.testing import CliRunner

    from edgestream.cli import app

    runner = CliRunner()
    audio = str(spoken_questions[0])
    rescored = runner.invoke(app, ["transcribe", audio, "--rescore", str(tiny_model_dir), "--json"])
    assert rescored.exit_code == 0, rescored.output
    assert json.loads(rescored.stdout)["text"]
    greedy = runner.invoke(app, ["transcribe", audio, "--beam", "0", "--rescore", "smollm2"])
    assert greedy.exit_code == 2
    assert "--rescore needs beam search" in greedy.stderr
    unknown = runner.invoke(app, ["transcribe", audio, "--rescore", "no-such-model"])
    assert unknown.exit_code == 2
    assert "no-such-model" in unknown.stderr and "Traceback" not in unknown.output
