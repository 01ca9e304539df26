"""The accelerator recipe, run on the CPU: batches, prompts files, and a whole run."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from edgestream.llm.accelerated import _parser, answer_batch, read_prompts, train
from edgestream.llm.loading import load_language_model
from edgestream.llm.msa import SpeculativeStreams, StreamConfig, load_streams, save_streams
from edgestream.llm.train import IGNORE
from tests.conftest import TINY_CORPUS


def _record(prompt_length: int, length: int, dim: int = 4) -> dict:
    return {
        "tokens": torch.arange(100, 100 + length),
        "prompt_length": prompt_length,
        "split_hidden": torch.randn(length - 1, dim),
    }


def test_answer_batch_labels_stream_j_at_t_with_token_t_plus_2_plus_j() -> None:
    records = [_record(3, 12), _record(5, 8)]
    batch = answer_batch(records, 4, 3, random.Random(1), "cpu")
    assert batch.split_hidden.shape == (2, 12, 4) and batch.tokens.shape == (2, 12)
    assert torch.equal(batch.split_hidden[1, :7], records[1]["split_hidden"])
    assert (batch.split_hidden[1, 7:] == 0).all() and (batch.tokens[1, 8:] == IGNORE).all()
    for b, record in enumerate(records):
        length, start = len(record["tokens"]), record["prompt_length"] - 1
        picked = [t for t in batch.positions[b].tolist()]
        answer_positions = min(4, length - 2 - start)
        assert all(start <= t < length - 2 for t in picked[:answer_positions])
        for i, t in enumerate(picked):
            for j in range(3):
                expected = (
                    int(record["tokens"][t + 2 + j])
                    if i < answer_positions and t + 2 + j < length
                    else IGNORE
                )
                assert batch.targets[b, i, j] == expected


def test_prompts_files_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a gzipped JSON list of prompts"):
        read_prompts(bad)
    bad.write_bytes(gzip.compress(json.dumps([{"prompt": "no category"}]).encode()))
    with pytest.raises(ValueError, match="not a gzipped JSON list"):
        read_prompts(bad)


def test_a_whole_run_distils_trains_each_arm_and_writes_loadable_streams(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    init = tmp_path / "init.safetensors"
    config = StreamConfig(n_streams=2, n_stream_layers=1, adapter_rank=4, draft_vocab_size=64)
    save_streams(SpeculativeStreams(lm.model.config, config), init, {"run": "tiny"})
    prompts = tmp_path / "prompts.json.gz"
    rows = [
        {"category": "t", "key": str(i), "prompt": text} for i, text in enumerate(TINY_CORPUS * 3)
    ]
    prompts.write_bytes(gzip.compress(json.dumps(rows).encode()))
    out = tmp_path / "out"
    args = _parser().parse_args(
        ["train", str(tiny_model_dir), str(prompts), str(init), str(out), "--device", "cpu",
         "--arms", "0,3", "--distill-batch", "4", "--max-new-tokens", "12", "--batch", "3",
         "--positions", "4", "--warmup", "1", "--train-seconds", "1.5", "--held-out", "2"]
    )  # fmt: skip
    train(args)
    report = json.loads((out / "report.json").read_text())
    assert report["sequences"] == len(rows) and report["answer_tokens"] > 0
    for rank in (0, 3):
        arm = report["arms"][f"ffn{rank}"]
        assert arm["steps"] >= 1 and len(arm["held_out_top1_after"]) == 2
        streams, info = load_streams(out / f"streams-ffn{rank}.safetensors", lm.model)
        assert streams.config.ffn_rank == rank and info["steps"] == arm["steps"]
        assert streams.config.n_streams == 2 and info["sequences"] == len(rows) - 2
    assert torch.empty(1).device.type == "cpu"  # the default device is given back
