"""Stream training: captured states, learning, resuming, and the CLI under torchrun (DDP)."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from edgestream.llm.distill import distill, load_shards
from edgestream.llm.loading import load_language_model
from edgestream.llm.msa import SpeculativeStreams, StreamConfig
from edgestream.llm.tasks import TaskPrompt
from edgestream.llm.train import IGNORE, TrainConfig, hold_out, make_batch, train_streams
from tests.conftest import TINY_CORPUS

STREAMS = StreamConfig(n_streams=2, n_stream_layers=1, adapter_rank=4, draft_vocab_size=64)


@pytest.fixture(scope="module")
def records(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate(TINY_CORPUS * 3)]
    shards = distill(lm, prompts, tmp_path_factory.mktemp("distill"), 1, 24, batch_size=4)
    return load_shards(shards)


def test_captured_states_equal_a_fresh_forward(tiny_model_dir: Path, records: list[dict]) -> None:
    model = load_language_model(str(tiny_model_dir), pack=False).model
    for record in records[:3]:
        tokens = record["tokens"][None]
        cache = model.new_cache(tokens.shape[1])
        x, rope, mask = model.prepare(tokens, cache)
        x = model.layers[0](x, rope, mask, cache, 0)
        states = record["split_hidden"].float()
        assert states.shape[0] == tokens.shape[1] - 1  # the last token is never fed back
        torch.testing.assert_close(x[0, :-1], states, rtol=0.02, atol=0.02)  # stored in bf16


def _train(
    model_dir: Path, records: list[dict], out: Path, steps: int, dev: list[dict] = ()
) -> tuple[list[tuple], list[float] | None]:
    model = load_language_model(str(model_dir), pack=False).model
    log: list[tuple] = []
    config = TrainConfig(
        steps=steps,
        batch_sequences=4,
        positions_per_sequence=8,
        lr=1e-2,
        warmup_steps=5,
        checkpoint_every=10,
    )
    report = lambda *a: log.append(a)  # noqa: E731
    _, dev_top1 = train_streams(model, records, 1, STREAMS, config, out, "tiny", report, None, dev)
    return log, dev_top1


def test_streams_learn(tiny_model_dir: Path, records: list[dict], tmp_path: Path) -> None:
    training, held = hold_out(records, 4)
    _, untrained = _train(tiny_model_dir, training, tmp_path / "untrained", 1, held)
    log, trained = _train(tiny_model_dir, training, tmp_path / "trained", 80, held)
    first = sum(loss for _, loss, _ in log[:10]) / 10
    last = sum(loss for _, loss, _ in log[-10:]) / 10
    assert last < 0.8 * first
    assert log[-1][2][0] > log[0][2][0]  # stream-1 top-1 accuracy rose on training batches
    assert len(trained) == STREAMS.n_streams
    assert trained[0] > untrained[0]  # and on sequences it never trained on


def _trained_positions(records: list[dict], config: TrainConfig) -> list[tuple[int, int]]:
    """(sequence, position) of every labelled stream position of one batch, its targets checked."""
    gamma = 2
    batch = make_batch(records, config, gamma, random.Random(0))
    chosen = []
    for b, r in enumerate(records):
        seq = r["tokens"]
        for i, t in enumerate(batch.positions[b].tolist()):
            labels = batch.targets[b, i]
            if (labels == IGNORE).all():
                continue  # padding
            chosen.append((b, t))
            for j in range(gamma):  # stream j at t predicts token t + 1 + j (t + 2 + j, 0-based)
                expected = seq[t + 2 + j] if t + 2 + j < len(seq) else IGNORE
                assert labels[j] == expected
    return chosen


def test_prompt_positions_train_on_the_prompt_text_only_when_asked(records: list[dict]) -> None:
    chunk = records[:4]
    answers_only = TrainConfig(batch_sequences=4, positions_per_sequence=3)
    for b, t in _trained_positions(chunk, answers_only):
        assert t >= chunk[b]["prompt_length"] - 1
    with_prompts = TrainConfig(
        batch_sequences=4, positions_per_sequence=3, prompt_positions_per_sequence=2
    )
    chosen = _trained_positions(chunk, with_prompts)
    for b, r in enumerate(chunk):
        mine = [t for c, t in chosen if c == b]
        in_prompt = [t for t in mine if t < r["prompt_length"] - 1]
        assert len(in_prompt) == min(2, r["prompt_length"] - 1)
        assert len(mine) - len(in_prompt) == min(3, len(r["tokens"]) - r["prompt_length"] - 1)
    with pytest.raises(ValueError, match="prompt_positions_per_sequence"):
        TrainConfig(prompt_positions_per_sequence=-1)


def test_held_out_sequences_do_not_depend_on_order(records: list[dict]) -> None:
    def contents(chosen: list[dict]) -> set[tuple[int, ...]]:
        return {tuple(r["tokens"].tolist()) for r in chosen}

    training, held = hold_out(records, 3)
    assert 1 <= len(contents(held)) == min(3, len(records) // 10)
    assert len(training) + len(held) == len(records)
    assert not contents(held) & contents(training)  # a copy of a held sequence never trains
    assert contents(hold_out(records[::-1], 3)[1]) == contents(held)
    assert hold_out(records, 0) == (records, [])
    with pytest.raises(ValueError, match="hold out"):
        hold_out(records, -1)


def test_replayed_sequences_train_but_are_never_held_out(records: list[dict]) -> None:
    def contents(chosen: list[dict]) -> set[tuple[int, ...]]:
        return {tuple(r["tokens"].tolist()) for r in chosen}

    new, old = records[: len(records) // 2], records[len(records) // 2 :]
    alone_training, alone_held = hold_out(new, 3)
    training, held = hold_out(new, 3, old)
    assert contents(held) == contents(alone_held)  # replaying leaves the measurement alone
    assert contents(training) == contents(alone_training) | (contents(old) - contents(held))
    # an old copy of a held-out sequence is dropped rather than trained on
    training, held = hold_out(new, 3, old + held)
    assert not contents(held) & contents(training)


def test_training_resumes_from_its_checkpoint(
    tiny_model_dir: Path, records: list[dict], tmp_path: Path
) -> None:
    _train(tiny_model_dir, records, tmp_path, 10)
    log, _ = _train(tiny_model_dir, records, tmp_path, 15)
    assert [step for step, *_ in log] == [11, 12, 13, 14, 15]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 15
    assert not list(tmp_path.glob("*.tmp"))


def test_training_continues_from_given_streams(
    tiny_model_dir: Path, records: list[dict], tmp_path: Path
) -> None:
    model = load_language_model(str(tiny_model_dir), pack=False).model
    _train(tiny_model_dir, records, tmp_path / "first", 20)
    first = SpeculativeStreams(model.config, STREAMS)
    first.load_state_dict(torch.load(tmp_path / "first" / "checkpoint.pt")["weights"])
    first.draft_vocab.copy_(first.draft_vocab.flip(0))  # not what these records would choose
    config = TrainConfig(steps=1, batch_sequences=2, positions_per_sequence=4, lr=1e-12)
    # The given streams' configuration wins over the one passed (another draft vocabulary size).
    other = StreamConfig(n_streams=2, n_stream_layers=1, adapter_rank=4, draft_vocab_size=32)
    continued, _ = train_streams(
        model, records, 1, other, config, tmp_path / "second", "tiny", None, copy.deepcopy(first)
    )
    assert continued.config == STREAMS
    assert torch.equal(continued.draft_vocab, first.draft_vocab)
    for name, weight in first.state_dict().items():
        torch.testing.assert_close(continued.state_dict()[name], weight, rtol=0, atol=1e-9)


def test_continued_streams_gain_feed_forward_adapters_that_train(
    tiny_model_dir: Path, records: list[dict], tmp_path: Path
) -> None:
    """An ffn_rank asked of given streams without feed-forward adapters adds them (the rest of
    the given configuration still wins); they start at zero and move with training."""
    model = load_language_model(str(tiny_model_dir), pack=False).model
    torch.manual_seed(1)
    first = SpeculativeStreams(model.config, STREAMS)
    asked = StreamConfig(n_streams=3, n_stream_layers=1, adapter_rank=2, ffn_rank=3)
    config = TrainConfig(steps=3, batch_sequences=2, positions_per_sequence=4, lr=1e-2)
    continued, _ = train_streams(
        model, records, 1, asked, config, tmp_path, "tiny", None, copy.deepcopy(first)
    )
    assert continued.config == StreamConfig(**{**STREAMS.to_dict(), "ffn_rank": 3})
    adapter = continued.adapters[0]
    assert adapter.gate_up.down.weight.shape == (3, model.config.dim)
    assert adapter.down.up.weight.abs().sum() > 0  # zero at the start, trained since
    weights = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["weights"]
    assert "adapters.0.down.up.weight" in weights


def test_distilling_more_prompts_reuses_the_shards_of_the_first_ones(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate(TINY_CORPUS * 3)]
    few = distill(lm, prompts[:8], tmp_path, 1, 8, batch_size=4, sort_block=8)
    stamps = {shard: shard.stat().st_mtime_ns for shard in few}
    more = distill(lm, prompts, tmp_path, 1, 8, batch_size=4, sort_block=8)
    assert set(few) < set(more)
    assert all(shard.stat().st_mtime_ns == stamps[shard] for shard in few)
    # A shard made with other settings is never taken for this run's.
    assert not set(distill(lm, prompts[:8], tmp_path, 1, 6, batch_size=4, sort_block=8)) & set(more)
    distilled = [r["tokens"][: r["prompt_length"]].tolist() for r in load_shards(more)]
    assert sorted(distilled) == sorted(lm.encode_prompt(p.prompt) for p in prompts)


def test_cli_trains_under_torchrun_with_two_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TINY_CORPUS) + "\n")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a free rendezvous port: no clash with another run's default 29500
            "--nproc_per_node=2",
            "-m",
            "edgestream",
            "train",
            "streams",
            "--model",
            str(tiny_model_dir),
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--steps",
            "6",
            "--batch",
            "2",
            "--positions",
            "4",
            "--streams",
            "2",
            "--stream-layers",
            "1",
            "--capture-layers",
            "2",
            "--adapter-rank",
            "2",
            "--max-new-tokens",
            "8",
            "--draft-vocab",
            "64",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-2000:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 6
    with safe_open(str(out / "streams.safetensors"), framework="pt") as f:
        info = json.loads(f.metadata()["info"])
    assert info["processes"] == 2


def test_cli_trains_the_baselines_on_the_streams_distilled_data(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`train medusa` and `train draft` reuse a streams run's distilled data (--distilled),
    so every drafter learns from the same answers; their weights then decode via the CLI."""
    from typer.testing import CliRunner

    from edgestream.cli import app

    runner = CliRunner()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TINY_CORPUS) + "\n")
    common = ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--max-new-tokens", "8"]
    common += ["--capture-layers", "2", "--steps", "4", "--batch", "2", "--positions", "4"]
    streams_run = tmp_path / "streams"
    result = runner.invoke(
        app,
        [
            "train",
            "streams",
            *common,
            "--out",
            str(streams_run),
            "--stream-layers",
            "1",
            "--draft-vocab",
            "64",
        ],
    )
    assert result.exit_code == 0, result.output
    shards = sorted((streams_run / "distill-at-1").glob("shard-*.pt"))
    assert shards
    stamps = [s.stat().st_mtime_ns for s in shards]
    for kind, extra, weights in (
        ("medusa", ["--heads", "2", "--draft-vocab", "64"], "medusa.safetensors"),
        ("draft", ["--layers", "1"], "draft.safetensors"),
    ):
        out = tmp_path / kind
        args = ["train", kind, *common, "--out", str(out), "--distilled", str(streams_run), *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert not (out / "distill-at-1").exists()  # reused, not distilled again
        generated = runner.invoke(
            app,
            [
                "generate",
                "the quick brown fox",
                "--model",
                str(tiny_model_dir),
                "--method",
                kind,
                f"--{kind}",
                str(out / weights),
                "--max-new-tokens",
                "10",
                "--compare",
                "--json",
            ],
        )
        assert generated.exit_code == 0, generated.output
        assert json.loads(generated.stdout)["exact_match_vs_ar"] is True
    assert [s.stat().st_mtime_ns for s in shards] == stamps


def test_cli_replays_an_earlier_runs_distilled_answers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`train streams --replay RUN` trains on RUN's distilled answers too, without distilling
    them again, and holds out only the new run's own sequences; a folder distilled at another
    layer (or none) is refused by name before anything is distilled."""
    from typer.testing import CliRunner

    from edgestream.cli import app

    runner = CliRunner()
    common = ["--model", str(tiny_model_dir), "--max-new-tokens", "8", "--capture-layers", "2"]
    common += ["--steps", "2", "--batch", "2", "--positions", "4", "--stream-layers", "1"]
    common += ["--draft-vocab", "64", "--dev-sequences", "1"]

    def train(name: str, lines: list[str], *extra: str) -> dict:
        prompts = tmp_path / f"{name}.txt"
        prompts.write_text("\n".join(lines) + "\n")
        out = tmp_path / name
        args = ["train", "streams", *common, "--prompts", str(prompts), "--out", str(out)]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        with safe_open(str(out / "streams.safetensors"), framework="pt") as f:
            return json.loads(f.metadata()["info"])

    # ten distinct prompts per run, so each holds one sequence out (at most a tenth)
    lines = [f"{i}. {text}" for i, text in enumerate(TINY_CORPUS * 5)]
    half = len(lines) // 2
    first = train("first", lines[:half])
    shards = sorted((tmp_path / "first" / "distill-at-1").glob("shard-*.pt"))
    stamps = [s.stat().st_mtime_ns for s in shards]
    alone = train("alone", lines[half:])
    replaying = train("replaying", lines[half:], "--replay", str(tmp_path / "first"))
    assert [s.stat().st_mtime_ns for s in shards] == stamps  # read, not distilled again
    assert replaying["replayed"] == [str(tmp_path / "first")]
    assert replaying["dev_sequences"] == alone["dev_sequences"] == 1
    assert replaying["sequences"] == alone["sequences"] + first["sequences"] + 1
    assert replaying["dev_top1"] is not None

    elsewhere = ["--replay", str(tmp_path / "first"), "--capture-layers", "1"]
    result = runner.invoke(
        app,
        [
            "train",
            "streams",
            *common,
            "--prompts",
            str(tmp_path / "alone.txt"),
            "--out",
            str(tmp_path / "never"),
            *elsewhere,
        ],
    )
    assert result.exit_code == 2
    assert "no distilled answers captured at layer" in result.output
    assert not (tmp_path / "never").exists()
