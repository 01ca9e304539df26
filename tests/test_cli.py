"""The command line: JSON output, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgestream.cli import app

runner = CliRunner()
JSON_KEYS = {
    "text",
    "token_ids",
    "new_tokens",
    "forward_passes",
    "seconds",
    "tokens_per_second",
    "mean_accepted",
    "method",
    "model",
}


def test_generate_json_on_a_local_model(tiny_model_dir: Path) -> None:
    result = runner.invoke(
        app,
        [
            "generate",
            "the quick brown fox",
            "--model",
            str(tiny_model_dir),
            "--json",
            "--max-new-tokens",
            "6",
            "--no-chat",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record.keys() >= JSON_KEYS
    assert record["new_tokens"] == len(record["token_ids"]) <= 6
    assert record["mean_accepted"] == 1.0 and record["method"] == "ar"


def test_generate_streams_text_then_stats(tiny_model_dir: Path) -> None:
    result = runner.invoke(
        app,
        [
            "generate",
            "what is the capital",
            "--model",
            str(tiny_model_dir),
            "--max-new-tokens",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.stderr


def test_the_tree_options_reach_the_decoder(tiny_model_dir: Path, tiny_streams: Path) -> None:
    def generate(*tree: str) -> dict[str, object]:
        argv = ["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--no-chat"]
        argv += ["--method", "ss", "--streams", str(tiny_streams), "--max-new-tokens", "12"]
        result = runner.invoke(app, [*argv, "--json", "--compare", *tree])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    # A one-node tree is the root alone: one token per pass, as AR. A chain of one candidate
    # per depth verifies several, and neither changes a token.
    root_only = generate("--tree-nodes", "1")
    assert root_only["mean_accepted"] == 1.0 and root_only["exact_match_vs_ar"] is True
    chain = generate("--tree-nodes", "4", "--tree-top-k", "1,1,1")
    assert chain["exact_match_vs_ar"] is True
    assert generate("--no-context-drafts")["exact_match_vs_ar"] is True


def test_generate_in_q4_1_with_streams(tiny_model_dir: Path, tiny_streams: Path) -> None:
    argv = ["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--no-chat"]
    argv += ["--dtype", "q4_1", "--method", "ss", "--streams", str(tiny_streams)]
    result = runner.invoke(app, [*argv, "--max-new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["dtype"] == "q4_1" and record["new_tokens"] == len(record["token_ids"]) == 8


def _bad_input_cases(tiny: Path, tmp: Path) -> list[tuple[list[str], str]]:
    bert = tmp / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    long_prompt = " ".join(["the quick brown fox"] * 60)  # > 96 tokens, the tiny context
    adapter = tmp / "adapter.safetensors"
    adapter.write_bytes(b"refused before it is read")
    not_audio = tmp / "notes.wav"
    not_audio.write_text("not audio")
    manifest = tmp / "manifest.jsonl"
    manifest.write_text("")
    train_asr = ["train", "asr", "--manifest", str(manifest), "--dev", str(manifest)]
    return [
        ([*train_asr, "--out", str(tmp / "run"), "--config", str(not_audio)], "is not JSON"),
        (["numerics", "activations", "--audio", str(not_audio)], "not a readable audio file"),
        (["asr", "lm", "--out", str(tmp / "lm.arpa"), "--order", "4"], "a --min-counts entry"),
        (["generate", ""], "prompt is empty"),
        (["generate", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["generate", "hi", "--model", str(tmp / "missing.gguf")], "does not exist"),
        (["generate", "hi", "--model", str(bert)], "holds a 'bert' model"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["generate", "hi", "--method", "lookahead"], "unknown method 'lookahead'"),
        (["generate", "hi", "--method", "medusa"], "--method medusa needs heads"),
        (["generate", "hi", "--method", "medusa", "--medusa", str(tmp / "no.st")], "no such file"),
        (["generate", "hi", "--dtype", "float16"], "unknown dtype 'float16'"),
        (["generate", "hi", "--dtype", "q4"], "expected one of float32, bfloat16, q4_1"),
        (
            ["generate", "hi", "--model", str(tiny), "--dtype", "q4_1", "--adapter", str(adapter)],
            "--adapter needs --dtype float32 or bfloat16, not q4_1",
        ),
        (["generate", "hi", "--draft-dtype", "int4"], "unknown draft dtype 'int4'"),
        (["generate", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["generate", "hi", "--tree-nodes", "0"], "--tree-nodes must be at least 1, got 0"),
        (["generate", "hi", "--tree-top-k", "4,x"], "--tree-top-k expects integers"),
        (["generate", "hi", "--tree-top-k", "4,0"], "--tree-top-k expects every count >= 1"),
        (["generate", "hi", "--tree-min-prob", "1"], "--tree-min-prob must be in [0, 1), got 1"),
        (["generate", long_prompt, "--model", str(tiny), "--no-chat"], "model's context is 96"),
    ]


def test_bad_input_gives_one_line_and_exit_code_2(tiny_model_dir: Path, tmp_path: Path) -> None:
    for args, message in _bad_input_cases(tiny_model_dir, tmp_path):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), args
        lines = result.stderr.strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])


def _unwritable_output_cases(tmp: Path) -> list[tuple[list[str], str]]:
    folder = tmp / "a-folder"
    folder.mkdir()
    a_file = tmp / "a-file"
    a_file.write_text("kept")
    return [
        (["bench", "spec", "--json", str(folder)], "is a folder; expected a file path"),
        (["bench", "generate", "--json", str(a_file / "r.json")], f"{a_file} is not a folder"),
        (
            ["bench", "asr", "--manifest", "m.jsonl", "--hypotheses", str(folder)],
            "--hypotheses",
        ),
        (["train", "streams", "--export", str(folder)], "--export"),
        (["train", "medusa", "--export", str(a_file / "deeper" / "h.st")], "is not a folder"),
        (["train", "asr", "--manifest", "m.jsonl", "--export", str(folder)], "is a folder"),
        (["export", "asr", "--out", str(a_file / "onnx")], "cannot make the folder"),
        (["asr", "lm", "--out", str(a_file / "lm.arpa")], "is not a folder"),
    ]


def test_unwritable_outputs_fail_before_any_work(tmp_path: Path) -> None:
    for args, message in _unwritable_output_cases(tmp_path):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])
    assert (tmp_path / "a-file").read_text() == "kept"  # nothing the user gave is touched


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "coreml", "--int8"], "--int8 is for ONNX"),
        (["--model", "no-such-model"], "unknown ASR model"),
    ],
)
def test_a_refused_export_makes_no_folder(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", "asr", "--out", str(out), *args])
    assert result.exit_code == 2 and message in result.stderr
    assert not out.exists()


def test_a_report_that_cannot_be_written_is_one_error(tmp_path: Path) -> None:
    from edgestream.cli.common import write_report

    (tmp_path / "a-file").write_text("kept")
    with pytest.raises(ValueError, match="could not write"):
        write_report({"x": 1}, tmp_path / "a-file" / "report.json")


def test_python_dash_m_reports_errors_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edgestream", "generate", "hi", "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: unknown model")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "generate", "--repeats", "0"],
        ["bench", "generate", "--dtypes", "int4"],
        ["asr", "synth", "--out", "unused", "--piper-fraction", "1.5"],
        ["asr", "synth", "--out", "unused", "--flite-fraction", "0.9"],
    ],
)
def test_bench_refuses_bad_options(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("error: ")


def test_cli_method_list_is_the_engines() -> None:
    """The CLI names methods without importing torch (fast --help); it must not drift."""
    from edgestream.bench.spec import REFERENCE_METHODS
    from edgestream.cli import BENCH_METHODS
    from edgestream.cli import METHODS as CLI_METHODS
    from edgestream.llm.methods import METHODS as ENGINE_METHODS

    assert CLI_METHODS == ENGINE_METHODS
    assert (*ENGINE_METHODS, *REFERENCE_METHODS) == BENCH_METHODS


def test_sampled_speculative_output_matches_ar_with_the_same_seed(tiny_model_dir: Path) -> None:
    args = ["generate", "the quick brown fox jumps over the lazy dog, the quick brown"]
    args += ["--model", str(tiny_model_dir), "--method", "pld", "--max-new-tokens", "24"]
    args += ["--temperature", "0.9", "--seed", "3", "--compare", "--json", "--no-chat"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["exact_match_vs_ar"] is True and record["new_tokens"] > 0
