"""Ranking draft trees from the command line: every tree reported, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgestream.bench.tree_shapes import main


def test_the_command_ranks_every_tree(
    trained_tiny_streams: tuple,
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, run = trained_tiny_streams
    out = tmp_path / "trees.json"
    argv = [str(run / "distill-at-2"), str(run / "streams.safetensors"), "--held-out", "3"]
    argv += ["--model", str(tiny_model_dir), "--nodes", "1,6", "--top-k", "2,2", "4,1,1"]
    main([*argv, "--threads", "1", "--json", str(out)])
    trees = json.loads(out.read_text())["trees"]
    assert [(t["nodes"], t["top_k"]) for t in trees] == [
        (1, [2, 2]),
        (6, [2, 2]),
        (1, [4, 1, 1]),
        (6, [4, 1, 1]),
    ]
    assert trees[0]["tokens_per_pass"] == 1.0  # the root alone: one token per pass
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_the_command_refuses_what_it_cannot_use(
    trained_tiny_streams: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, run = trained_tiny_streams
    streams = str(run / "streams.safetensors")
    for argv in (
        [str(tmp_path), streams],  # not a distill-at-N folder
        [str(run / "distill-at-2"), str(tmp_path / "absent.safetensors")],
        [str(run / "distill-at-2"), streams, "--nodes", "8,x"],
        [str(run / "distill-at-2"), streams, "--top-k", "0,1"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        assert capsys.readouterr().err.startswith("error: "), argv
