"""The results page's generated tables: rendered from reports, replaced between markers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgestream.bench.results import render_quality, render_spec, replace_block
from edgestream.cli import app

SETUP = {"cpu": "AMD EPYC", "threads": 2, "python": "3.11", "torch": "2.13.0", "dtype": "float32"}


def _stats(tps: float, speedup: float, accepted: float) -> dict:
    return {
        "tokens_per_second": tps,
        "speedup": speedup,
        "mean_accepted": accepted,
        "exact_match_vs_ar": 1.0,
    }


SPEC = {
    "max_new_tokens": 128,
    "setup": {**SETUP, "prompts": 2, "peak_memory_mib": 900.0},
    "methods": {
        "ar": {
            "overall": _stats(50, 1, 1),
            "categories": {"qa": _stats(50, 1, 1)},
            "extra_parameters": 0,
        },
        "medusa": {
            "overall": _stats(60, 1.2, 1.9),
            "categories": {"qa": _stats(55, 1.1, 1.7)},
            "extra_parameters": 20_203_776,
            "full_vocab_parameters": 114_575_616,
            "train_seconds": 2021,
        },
    },
}
QUALITY = {
    "task": "dialogsum",
    "prompts": 30,
    "max_new_tokens": 128,
    "setup": SETUP,
    "variants": [
        {"variant": "base", "mode": "base (zero-shot)", "rouge1": 20.5, "rougeLsum": 18.25},
        {
            "variant": "shared-dialogsum",
            "mode": "shared",
            "train_steps": 150,
            "train_seconds": 1200,
            "rouge1": 30.0,
            "rougeLsum": 27.0,
            "vs_previous": {
                "variant": "base",
                "rouge1": {"difference": 9.5, "low": 4.25, "high": 14.0},
                "rougeLsum": {"difference": 8.75, "low": 3.5, "high": 13.0},
            },
            "ar_tokens_per_second": 50.0,
            "speedup": 1.3,
            "mean_accepted": 2.1,
            "exact_match_vs_ar": 1.0,
        },
    ],
}


def test_spec_table_has_every_method_and_category() -> None:
    text = render_spec(SPEC)
    row = "| medusa | 60.0 | 1.20x | 1.90 | 1.00 | 20.2 M (114.6 M with full-vocabulary heads) |"
    assert row + " 34 min |" in text
    assert "| qa | 1.10x / 1.70 |" in text
    assert "900 MiB" in text and "AMD EPYC, 2 threads" in text


def test_quality_table_rows() -> None:
    text = render_quality(QUALITY)
    assert "| base | base (zero-shot) | - | 20.50 | 18.25 | - | - | - | - | - |" in text
    row = "| shared-dialogsum | shared | 150 steps, 20 min | 30.00 | 27.00 |"
    assert row + " +9.50 [+4.25, +14.00] | 50.0 | 1.30x | 2.10 | 1.00 |" in text


def test_blocks_are_replaced_between_their_markers_only() -> None:
    page = "intro\n<!-- begin spec -->\nold\n<!-- end spec -->\noutro\n"
    assert (
        replace_block(page, "spec", "new")
        == "intro\n<!-- begin spec -->\nnew\n<!-- end spec -->\noutro\n"
    )
    with pytest.raises(ValueError, match="no '<!-- begin quality"):
        replace_block(page, "quality", "x")


def test_cli_updates_the_page(tmp_path: Path) -> None:
    spec, quality, page = tmp_path / "spec.json", tmp_path / "q.json", tmp_path / "results.md"
    spec.write_text(json.dumps(SPEC))
    quality.write_text(json.dumps(QUALITY))
    page.write_text(
        "# R\n<!-- begin spec -->\n<!-- end spec -->\n"
        "<!-- begin quality-dialogsum -->\n<!-- end quality-dialogsum -->\n"
    )
    args = ["bench", "results", "--spec", str(spec), "--quality", str(quality), "--page", str(page)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "| medusa |" in text and "| shared-dialogsum | shared |" in text
    missing = CliRunner().invoke(
        app, ["bench", "results", "--spec", str(tmp_path / "none.json"), "--page", str(page)]
    )
    assert missing.exit_code == 2 and "no such report" in missing.stderr
