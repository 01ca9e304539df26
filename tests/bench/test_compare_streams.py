"""Comparing stream files in one run: every arm present, lossless, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edgestream.bench.compare_streams import main
from edgestream.llm.int8 import int8_available
from edgestream.llm.loading import load_language_model
from edgestream.llm.msa import SpeculativeStreams, StreamConfig, save_streams


@pytest.fixture()
def two_stream_files(tiny_model_dir: Path, tmp_path: Path) -> list[Path]:
    lm = load_language_model(str(tiny_model_dir))
    files = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        streams = SpeculativeStreams(lm.model.config, StreamConfig(3, 2, 4, draft_vocab_size=0))
        files.append(tmp_path / f"streams-{seed}.safetensors")
        save_streams(streams, files[-1], {})
    return files


def _compare(tiny_model_dir: Path, tmp_path: Path, *argv: str) -> dict[str, dict]:
    """Run the comparison on one short question with the tiny model; its report's methods."""
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["a b a b"]}))
    out = tmp_path / "report.json"
    options = ["--model", str(tiny_model_dir), "--suite-limit", "0", "--prompts", str(questions)]
    main([*argv, *options, "--max-new-tokens", "10", "--threads", "1", "--json", str(out)])
    return json.loads(out.read_text())["methods"]


def test_every_file_gets_both_arms_and_all_match_ar(
    tiny_model_dir: Path, two_stream_files: list[Path], tmp_path: Path
) -> None:
    files = map(str, two_stream_files)
    methods = _compare(tiny_model_dir, tmp_path, *files, "--labels", "old,new")
    assert list(methods) == ["ar", "pld", "ss@old", "ss-pld@old", "ss@new", "ss-pld@new"]
    assert all(m["overall"]["exact_match_vs_ar"] == 1.0 for m in methods.values())


def test_every_tree_gets_its_arms(
    tiny_model_dir: Path, two_stream_files: list[Path], tmp_path: Path
) -> None:
    argv = [str(two_stream_files[0]), "--labels", "s", "--trees", "1:4", "6:3,2", "--methods", "ss"]
    methods = _compare(tiny_model_dir, tmp_path, *argv)
    assert list(methods) == ["ar", "pld", "ss@s/1:4", "ss@s/6:3,2"]
    assert all(m["overall"]["exact_match_vs_ar"] == 1.0 for m in methods.values())
    assert methods["ss@s/1:4"]["overall"]["mean_accepted"] <= 1.0  # the root alone per pass


TWIN_OPTIONS = [
    pytest.param(["--context-drafts", "both"], ["context", "vocab"], id="context-drafts"),
    pytest.param(
        ["--draft-dtypes", "float32,int8"],
        ["float32", "int8"],
        id="draft-dtypes",
        marks=pytest.mark.skipif(not int8_available(), reason="no int8 engine in this PyTorch"),
    ),
]


@pytest.mark.parametrize(("option", "suffixes"), TWIN_OPTIONS)
def test_an_option_with_two_values_gives_each_arm_a_twin(
    tiny_model_dir: Path,
    tmp_path: Path,
    two_stream_files: tuple[Path, Path],
    option: list[str],
    suffixes: list[str],
) -> None:
    """--context-drafts both: a twin drafting from the streams' vocabulary only;
    --draft-dtypes: a twin per drafting precision."""
    argv = [str(two_stream_files[0]), "--labels", "s", *option]
    methods = _compare(tiny_model_dir, tmp_path, *argv, "--methods", "ss")
    assert list(methods) == ["ar", "pld", *(f"ss@s/{suffix}" for suffix in suffixes)]
    assert all(m["overall"]["exact_match_vs_ar"] == 1.0 for m in methods.values())


def test_missing_file_clashing_labels_and_negative_counts_are_refused(
    two_stream_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        [str(two_stream_files[0]), str(tmp_path / "absent.safetensors")],
        [*map(str, two_stream_files), "--labels", "same,same"],
        [*map(str, two_stream_files), "--chat-probe", "-1"],
        [*map(str, two_stream_files), "--trees", "8:4,x"],
        [*map(str, two_stream_files), "--trees", "8:4,3", "8:4,3"],
        [*map(str, two_stream_files), "--trees", "0:4"],
        [*map(str, two_stream_files), "--methods", "ss,medusa"],
        [*map(str, two_stream_files), "--draft-dtypes", "float32,int4"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.startswith("error: ")
