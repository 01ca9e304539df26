"""The accelerator recipe, run on the CPU: batches, prompts files, and a whole run."""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from edgestream.llm.accelerated import (
    _keep_best,
    _parser,
    answer_batch,
    distill_halving,
    medusa,
    read_prompts,
    records_from_answers,
    token_budget_batches,
    train,
    write_answers,
)
from edgestream.llm.loading import load_language_model
from edgestream.llm.medusa import load_medusa
from edgestream.llm.msa import SpeculativeStreams, StreamConfig, load_streams, save_streams
from edgestream.llm.tasks import TaskPrompt
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


def test_token_budget_batches_cover_every_prompt_once_within_both_limits() -> None:
    lengths = [random.Random(i).randint(1, 500) for i in range(300)]
    batches = token_budget_batches(lengths, max_batch=16, max_tokens=2000)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for batch in batches:
        assert len(batch) <= 16
        assert len(batch) * max(lengths[i] for i in batch) <= 2000 or len(batch) == 1
    assert max(len(b) for b in batches) == 16  # short prompts fill whole batches
    assert token_budget_batches([3000, 10], 4, 100) == [[1], [0]]  # too long alone: still kept


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
         "--positions", "4", "--warmup", "1", "--train-seconds", "1.5", "--held-out", "2",
         "--eval-seconds", "0.5"]
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
        assert arm["checks"] and arm["held_out_top1_after"] in [c[1] for c in arm["checks"]] + [
            arm["held_out_top1_before"]
        ]
    answers = json.loads(gzip.decompress((out / "answers.json.gz").read_bytes()))
    assert sorted(a["key"] for a in answers["answers"]) == sorted(r["key"] for r in rows)
    assert sum(a["held_out"] for a in answers["answers"]) == 2
    assert all(0 < len(a["answer"]) <= 12 for a in answers["answers"])
    assert torch.empty(1).device.type == "cpu"  # the default device is given back

    # A second run trains on the first one's answers, with the same held-out ones.
    again = _parser().parse_args(
        ["train", str(tiny_model_dir), str(prompts), str(init), str(tmp_path / "again"),
         "--device", "cpu", "--arms", "0", "--batch", "3", "--positions", "4", "--warmup", "1",
         "--train-seconds", "0.5", "--answers", str(out / "answers.json.gz")]
    )  # fmt: skip
    train(again)
    second = json.loads((tmp_path / "again" / "report.json").read_text())
    assert second["sequences"] == len(rows) and second["answer_tokens"] == report["answer_tokens"]
    again_info = load_streams(tmp_path / "again" / "streams-ffn0.safetensors", lm.model)[1]
    assert again_info["sequences"] == len(rows) - 2

    # The Medusa baseline trains on the same answers.
    heads_run = _parser().parse_args(
        ["medusa", str(tiny_model_dir), str(prompts), str(out / "answers.json.gz"),
         str(tmp_path / "medusa"), "--device", "cpu", "--draft-vocab", "32", "--batch", "3",
         "--positions", "4", "--warmup", "1", "--train-seconds", "0.5"]
    )  # fmt: skip
    medusa(heads_run)
    heads_file = tmp_path / "medusa" / "medusa.safetensors"
    with safe_open(str(heads_file), framework="pt") as f:  # half the bytes to carry back
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    heads, info = load_medusa(heads_file, lm.model, torch.float32)
    medusa_report = json.loads((tmp_path / "medusa" / "report.json").read_text())
    assert heads.config.n_heads == 4 and heads.config.draft_vocab_size == 32
    assert info["steps"] == medusa_report["medusa"]["steps"] >= 1
    assert info["sequences"] == len(rows) - 2 and len(info["held_out_top1"]) == 4
    assert torch.empty(1).device.type == "cpu"


def test_answers_written_and_read_back_give_the_distilled_records(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lm = load_language_model(str(tiny_model_dir), dtype="float32", pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate([*TINY_CORPUS, "why?"])]
    distilled = distill_halving(lm, prompts, 2, 10)
    path = tmp_path / "answers.json.gz"
    write_answers(path, distilled, 2, argparse.Namespace(model="tiny", max_new_tokens=10))
    read = records_from_answers(lm, prompts, path, 2, max_tokens=64)
    assert [r["held_out"] for r in read] == [True, True, False, False, False]
    for ours, theirs in zip(read, distilled, strict=True):
        assert torch.equal(ours["tokens"], theirs["tokens"]) and ours["key"] == theirs["key"]
        assert ours["prompt_length"] == theirs["prompt_length"]
        assert ours["split_hidden"].shape == theirs["split_hidden"].shape
        torch.testing.assert_close(
            ours["split_hidden"].float(), theirs["split_hidden"].float(), atol=2e-2, rtol=2e-2
        )
    with pytest.raises(ValueError, match="not answers to these prompts"):
        records_from_answers(lm, prompts[:2], path, 2, max_tokens=64)


def test_an_arm_keeps_its_best_streams_not_its_last() -> None:
    streams = torch.nn.Linear(2, 2)
    best_state = {k: v.clone() for k, v in streams.state_dict().items()}
    with torch.no_grad():
        streams.weight.add_(1.0)
    checks: list = []
    best, state = _keep_best(streams, lambda: [0.1, 0.1], [0.3, 0.2], best_state, 7, checks)
    assert best == [0.3, 0.2] and state is best_state and checks == [[7, [0.1, 0.1]]]
    best, state = _keep_best(streams, lambda: [0.4, 0.2], best, best_state, 9, checks)
    assert best == [0.4, 0.2] and torch.equal(state["weight"], streams.weight)
