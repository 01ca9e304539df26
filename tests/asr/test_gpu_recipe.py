"""The accelerator recipe, run on the CPU with tiny settings: sentences file, parallel features,
deadline training that keeps the best dev weights, float16 saving."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open

from edgestream.asr.conformer import ConformerConfig
from edgestream.asr.decode import CharVocabulary
from edgestream.asr.features import GlobalCmvn
from edgestream.asr.gpu_recipe import Batches, _parser, main, starting_point
from edgestream.asr.model_io import load_model
from edgestream.asr.text import read_splits, write_splits
from edgestream.asr.train import FeatureStore, TrainConfig, _lr_at, evaluate, scheduled_lr
from tests.asr.conftest import TINY_SENTENCES, needs_espeak, random_model_file


def test_sentences_file_round_trips_and_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "sentences.json.gz"
    write_splits(TINY_SENTENCES, path)
    assert read_splits(path) == TINY_SENTENCES
    (tmp_path / "plain.json").write_text("{}")
    with pytest.raises(ValueError, match="not a sentences file"):
        read_splits(tmp_path / "plain.json")
    (tmp_path / "partial.json.gz").write_bytes(gzip.compress(json.dumps({"train": []}).encode()))
    with pytest.raises(ValueError, match="not a sentences file"):
        read_splits(tmp_path / "partial.json.gz")


def test_schedule_warms_up_then_decays_to_two_percent_of_the_peak() -> None:
    config = TrainConfig(lr=1e-3, warmup_steps=10)
    assert scheduled_lr(0, 0.0, config) == pytest.approx(1e-4)
    assert scheduled_lr(9, 0.5, config) == pytest.approx(1e-3)  # warm-up wins over progress
    assert scheduled_lr(10, 0.0, config) == pytest.approx(1e-3)
    assert scheduled_lr(500, 0.5, config) == pytest.approx(1e-3 * (0.02 + 0.49))
    assert scheduled_lr(500, 1.0, config) == pytest.approx(2e-5)
    assert scheduled_lr(500, 7.0, config) == pytest.approx(2e-5)  # past the budget: the floor
    # The epoch-based schedule is the same curve over its steps.
    assert _lr_at(110, 210, config) == pytest.approx(scheduled_lr(110, 0.5, config))


@needs_espeak
def test_features_from_several_processes_equal_one_process(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    one = FeatureStore(tiny_corpus / "train.jsonl", tmp_path / "one")
    several = FeatureStore(tiny_corpus / "train.jsonl", tmp_path / "several", workers=3)
    assert several.lengths == one.lengths and several.texts == one.texts
    np.testing.assert_array_equal(np.asarray(several.frames), np.asarray(one.frames))


@needs_espeak
def test_batches_draw_the_same_augmentation_whichever_process_builds_them(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    store = FeatureStore(tiny_corpus / "train.jsonl", tmp_path / "cache")
    cmvn = GlobalCmvn.from_features(store.features(i).astype(np.float32) for i in range(4))
    augment = TrainConfig(vtlp_prob=1.0, bandlimit_prob=1.0)
    order = [[0, 1], [2, 3], [4]]
    batches = Batches(store, order, cmvn, CharVocabulary(), augment, seed=5)
    later = [batches[k] for k in (2, 0, 1)]  # another order, as workers would take them
    for k, batch in zip((2, 0, 1), later, strict=True):
        again = batches[k]
        assert torch.equal(again.features, batch.features)
        assert torch.equal(again.targets, batch.targets)
    other_epoch = Batches(store, order, cmvn, CharVocabulary(), augment, seed=6)
    assert not torch.equal(other_epoch[0].features, batches[0].features)


def _run(tmp_path: Path, *options: str) -> dict:
    sentences = tmp_path / "sentences.json.gz"
    write_splits(TINY_SENTENCES, sentences)
    args = _parser().parse_args(
        [
            *("train", str(sentences), str(tmp_path / "run"), "--hours", "0.01"),
            *("--device", "cpu", "--loader-workers", "1", "--reserve", "0", "--eval-seconds", "2"),
            *options,
        ]
    )
    args.run(args)
    return json.loads((tmp_path / "run" / "report.json").read_text())


@needs_espeak
def test_train_continues_a_model_and_keeps_the_weights_with_the_best_dev_wer(
    tmp_path: Path,
) -> None:
    init = random_model_file(tmp_path / "init.safetensors")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"train": {"max_frames": 2000, "warmup_steps": 5, "lr": 3e-3}}))
    report = _run(tmp_path, "--init", str(init), "--config", str(config), "--deadline", "25")
    assert report["steps"] > 0 and report["train_seconds"] <= 25
    assert report["corpus_seconds"]["train"]["espeak-seen"] > 0
    assert "test" not in report["corpus_seconds"]  # test audio is measured where the data is
    checks = [wer for _, wer in report["checks"]]
    assert len(checks) >= 2
    assert report["dev_wer_after"] == min([report["dev_wer_before"], *checks])
    trained = load_model(tmp_path / "run" / "model.safetensors")
    start = load_model(init)
    assert trained.model.config == start.model.config
    before, after = start.model.state_dict(), trained.model.state_dict()
    moved = any(not torch.equal(before[name], after[name]) for name in before)
    assert moved == (report["dev_wer_after"] < report["dev_wer_before"])
    # The run history carries the init's runs on and describes this one
    *earlier, this_run = trained.info["runs"]
    assert earlier == start.info.get("runs", [])
    assert this_run.startswith(f"gpu_recipe on cpu: --init {init}")
    assert f"-> {100 * report['dev_wer_after']:.2f}%" in this_run
    # The file holds the weights whose dev WER the report gives.
    dev = FeatureStore(tmp_path / "run" / "corpus" / "dev.jsonl", tmp_path / "dev-cache")
    wer = evaluate(trained.model, dev, trained.cmvn, trained.vocabulary, 16, 4)
    assert wer == pytest.approx(report["dev_wer_after"], abs=1e-4)
    # ... and last.safetensors those of the last step, whose check is the last one.
    last = load_model(tmp_path / "run" / "last.safetensors")
    assert last.info["weights"] == f"last step ({report['steps']}), not the best dev check"
    assert report["dev_wer_last"] == checks[-1]
    wer = evaluate(last.model, dev, last.cmvn, last.vocabulary, 16, 4)
    assert wer == pytest.approx(report["dev_wer_last"], abs=1e-4)


@needs_espeak
def test_train_from_scratch_writes_a_float16_file_that_loads_as_float32(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    tiny = {"d_model": 32, "num_heads": 2, "num_layers": 2, "subsampling_channels": 16}
    settings = {"model": tiny, "train": {"max_frames": 2000, "vocabulary": "char"}}
    config.write_text(json.dumps(settings))
    report = _run(tmp_path, "--config", str(config), "--deadline", "12", "--save-dtype", "float16")
    assert report["steps"] > 0 and report["model_config"]["d_model"] == 32
    path = tmp_path / "run" / "model.safetensors"
    with safe_open(str(path), "pt") as handle:
        names = handle.keys()
        assert {handle.get_tensor(name).dtype for name in names} == {torch.float16}
    model = load_model(path)
    assert {p.dtype for p in model.model.parameters()} == {torch.float32}
    assert model.vocabulary.to_metadata()["vocabulary"] == "char"
    assert model.info["runs"][0].startswith("gpu_recipe on cpu: from scratch")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--hours", "0"], "--hours > 0"),
        (["--deadline", "10", "--reserve", "20"], "--deadline > --reserve"),
        (["--piper-fraction", "1.5"], "piper_fraction in [0, 1]"),
    ],
)
def test_bad_settings_are_refused_with_one_line_and_exit_code_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    message: str,
) -> None:
    sentences = tmp_path / "sentences.json.gz"
    write_splits(TINY_SENTENCES, sentences)
    for argv, expected in (
        ([str(tmp_path / "missing.json.gz")], "not a sentences file"),
        ([str(sentences), *options], message),
    ):
        out = str(tmp_path / "out")
        monkeypatch.setattr("sys.argv", ["gpu_recipe", "train", argv[0], out, *argv[1:]])
        with pytest.raises(SystemExit) as stop:
            main()
        assert stop.value.code == 2
        error = capsys.readouterr().err
        assert expected in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing was written


def test_an_init_model_can_grow_but_not_change_its_vocabulary(tmp_path: Path) -> None:
    init = random_model_file(tmp_path / "init.safetensors")
    store = SimpleNamespace(texts=["unused"])
    grown = starting_point(init, ConformerConfig(), TrainConfig(grow_layers=2), store)[0]
    assert grown.config.num_layers == load_model(init).model.config.num_layers + 2
    with pytest.raises(ValueError, match="char vocabulary, not bpe-64"):
        starting_point(init, ConformerConfig(), TrainConfig(vocabulary="bpe-64"), store)
