"""Task-quality metrics, and `bench quality` end to end where the shared task data exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from edgestream.bench.quality import (
    final_number,
    normalise_sql,
    paired_difference,
    per_prompt,
    rouge,
    score,
)
from edgestream.cli import app
from edgestream.llm.loading import load_language_model
from edgestream.llm.msa import SpeculativeStreams, StreamConfig, save_streams
from tests.conftest import needs_shared_data, tiny_llama, tiny_tokenizer


def test_rouge_rewards_overlap_and_matches_rouge_score() -> None:
    perfect = rouge(["the cat sat on the mat."], ["the cat sat on the mat."])
    assert perfect == {"rouge1": 100.0, "rougeLsum": 100.0}
    partial = rouge(["the cat sat."], ["the cat sat on the mat."])
    # unigram P = 3/3, R = 3/6 -> F1 = 2/3
    assert partial["rouge1"] == pytest.approx(66.67, abs=0.01)
    assert rouge(["dogs bark"], ["the cat sat"])["rouge1"] == 0.0


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("SELECT count(*) FROM users;", "select count ( * ) from users", True),
        ('```sql\nSELECT name FROM t WHERE x = "a"\n```', "select name from t where x='a'", True),
        ("SELECT name FROM t; DROP TABLE t", "SELECT name FROM t", True),  # first statement
        ("SELECT name FROM t", "SELECT id FROM t", False),
    ],
)
def test_sql_normalisation(a: str, b: str, same: bool) -> None:
    assert (normalise_sql(a) == normalise_sql(b)) is same


def test_final_numbers_and_task_scores() -> None:
    assert final_number("so 12 + 30 = 42 apples") == 42.0
    assert final_number("no digits here") is None
    assert final_number("-1,250.5") == -1250.5
    assert score("gsm8k", ["it is 42", "maybe 7", "none"], ["42", "8", "3"]) == {"accuracy": 33.33}
    assert score("spider", ["SELECT 1", "SELECT 2"], ["select 1;", "select 3"]) == {
        "exact_match": 50.0
    }
    with pytest.raises(ValueError, match="unknown task"):
        score("xsum", ["a"], ["a"])


def test_per_prompt_scores_average_to_the_task_score() -> None:
    predictions, references = ["it is 42", "maybe 7", "none"], ["42", "8", "3"]
    assert per_prompt("gsm8k", predictions, references) == {"accuracy": [100.0, 0.0, 0.0]}
    texts = ["the cat sat.", "a dog barked loudly.", "rain"]
    truth = ["the cat sat on the mat.", "the dog barked.", "sun"]
    scores = per_prompt("dialogsum", texts, truth)
    assert scores["rouge1"][0] == pytest.approx(200 / 3)
    assert score("dialogsum", texts, truth) == {k: round(sum(v) / 3, 2) for k, v in scores.items()}


def test_paired_bootstrap_interval() -> None:
    rng = __import__("random").Random(3)
    before = [rng.uniform(20, 60) for _ in range(40)]
    # The same prompts, each 5 points better plus noise: the interval excludes 0, holds 5.
    better = [b + 5 + rng.gauss(0, 3) for b in before]
    gain = paired_difference(before, better)
    assert 0 < gain["low"] < 5 < gain["high"]
    assert gain["difference"] == pytest.approx(sum(better) / 40 - sum(before) / 40, abs=0.01)
    # Noise around no change: the interval straddles 0.
    same = [b + rng.gauss(0, 3) for b in before]
    tie = paired_difference(before, same)
    assert tie["low"] < 0 < tie["high"]
    assert paired_difference(before, same) == tie  # seeded: reproducible
    with pytest.raises(ValueError, match="no prompts"):
        paired_difference([], [])


def _tiny_model_with_room(tmp_path: Path) -> Path:
    """The tiny model with a context long enough for real task prompts."""
    tokenizer = tiny_tokenizer()
    model_dir = tmp_path / "tiny-512"
    tiny_llama(max_position=512, vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


@needs_shared_data
def test_bench_quality_scores_the_base_model_on_held_back_prompts(tmp_path: Path) -> None:
    model_dir = _tiny_model_with_room(tmp_path)
    out = tmp_path / "quality.json"
    args = ["bench", "quality", "--task", "e2e", "--model", str(model_dir), "--limit", "2"]
    args += ["--max-new-tokens", "4", "--threads", "1", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["task"] == "e2e" and report["prompts"] == 2
    (base,) = report["variants"]
    assert base["variant"] == "base" and {"rouge1", "rougeLsum"} <= base.keys()
    assert "speedup" not in base  # no streams bundled for a tiny local model


def test_bench_quality_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, message in (
        (["--task", "xsum"], "unknown task 'xsum'"),
        (["--task", "e2e", "--adapter", str(tmp_path / "no.safetensors")], "no such file"),
        (["--task", "e2e", "--limit", "0"], "--limit"),
    ):
        result = runner.invoke(app, ["bench", "quality", *args])
        assert result.exit_code == 2, result.output
        assert message in result.stderr


@needs_shared_data
def test_shared_and_lora_adapters_train_on_a_task_and_are_compared(tmp_path: Path) -> None:
    """`train streams --mode shared|lora --task e2e`, then `bench quality` with both adapters:
    three variants scored, and SS on the shared adapter is lossless against its own AR."""
    model_dir = _tiny_model_with_room(tmp_path)
    lm = load_language_model(str(model_dir))
    start = SpeculativeStreams(lm.model.config, StreamConfig(3, 1, 2, 2, draft_vocab_size=32))
    save_streams(start, tmp_path / "start.safetensors", {})
    runner = CliRunner()
    adapters = []
    for mode in ("lora", "shared"):
        out = tmp_path / mode
        args = ["train", "streams", "--mode", mode, "--task", "e2e", "--model", str(model_dir)]
        args += ["--out", str(out), "--prompts-per-task", "8", "--steps", "3", "--batch", "2"]
        args += ["--positions", "4", "--lora-rank", "2", "--max-new-tokens", "16"]
        if mode == "shared":
            args += ["--init-streams", str(tmp_path / "start.safetensors")]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        adapters += ["--adapter", str(out / "adapter.safetensors")]
    with safe_open(str(tmp_path / "shared" / "adapter.safetensors"), framework="pt") as f:
        # the streams started from the given ones (their settings), not from fresh defaults
        assert json.loads(f.metadata()["stream_config"]) == start.config.to_dict()
    report_path = tmp_path / "quality.json"
    args = ["bench", "quality", "--task", "e2e", "--model", str(model_dir), "--limit", "2"]
    args += ["--max-new-tokens", "6", "--threads", "1", *adapters, "--json", str(report_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    base, lora, shared = json.loads(report_path.read_text())["variants"]
    assert (base["mode"], lora["mode"], shared["mode"]) == ("base (zero-shot)", "lora", "shared")
    assert (base["variant"], lora["variant"], shared["variant"]) == ("base", "lora", "shared")
    assert lora["train_steps"] == shared["train_steps"] == 3
    assert "speedup" not in lora and shared["exact_match_vs_ar"] == 1.0
    assert "vs_previous" not in base
    assert shared["vs_previous"]["variant"] == "lora"
    paired = shared["vs_previous"]["rouge1"]
    assert paired["low"] <= paired["difference"] <= paired["high"]
    assert len(shared["per_prompt"]["rouge1"]) == 2
