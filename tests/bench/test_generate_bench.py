"""The AR benchmark's bookkeeping (not its timings): both engines agree, the report is whole."""

from __future__ import annotations

from pathlib import Path

from edgestream.bench.generate import bench_generate


def test_bench_reports_exact_match_and_ratios(tiny_model_dir: Path) -> None:
    report = bench_generate(
        str(tiny_model_dir), ["float32"], ["the quick brown fox", "what is"], 8, 1, 1
    )
    assert report["setup"]["threads"] == 1 and report["setup"]["prompts"] == 2
    (result,) = report["results"]
    assert result["exact_match"] == 1.0
    assert result["speedup"] > 0 and len(result["prompts"]) == 2
    assert all(p["new_tokens"] >= 1 for p in result["prompts"])


def test_q4_1_is_timed_against_transformers_in_float32(tiny_model_dir: Path) -> None:
    report = bench_generate(str(tiny_model_dir), ["q4_1"], ["the quick brown fox"], 6, 1, 1)
    (result,) = report["results"]
    assert result["dtype"] == "q4_1" and result["transformers_dtype"] == "float32"
    assert result["prompts"][0]["new_tokens"] >= 1
