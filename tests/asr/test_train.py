"""ASR training: the loss falls, runs resume, the model file loads, and torchrun (DDP) works."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soxr
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from edgestream.asr.conformer import ConformerCTC
from edgestream.asr.decode import CharVocabulary
from edgestream.asr.features import GlobalCmvn, compute_fbank, load_audio
from edgestream.asr.manifest import read_manifest, write_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.train import (
    FeatureStore,
    TrainConfig,
    _mel_bin_centres_hz,
    colour_spectrum,
    consistency_loss,
    ctc_loss,
    deepened,
    length_batches,
    limit_bandwidth,
    make_batch,
    pad_with_silence,
    random_equaliser,
    train_asr,
    warp_frequencies,
)

from .conftest import TINY

FAST = TrainConfig(epochs=3, warmup_steps=3, max_frames=4000, lr=3e-3, eval_utterances=10)


def test_length_batches_cover_everything_once_within_the_budget() -> None:
    lengths = [5, 300, 40, 41, 1000, 7, 299, 120]
    batches = length_batches(lengths, 1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 1000 or len(b) == 1 for b in batches)


def test_silence_padding_keeps_the_utterance_and_adds_quiet_frames_around_it() -> None:
    utterance = compute_fbank(np.random.default_rng(0).standard_normal(16_000).astype(np.float32))
    config = TrainConfig(silence_prob=0.5, max_lead_silence_frames=100, max_trail_silence_frames=50)
    rng, added, padded_count = random.Random(0), [], 0
    for _ in range(200):
        padded = pad_with_silence(utterance, config, rng)
        extra = len(padded) - len(utterance)
        assert 0 <= extra <= 150
        if extra:
            padded_count += 1
            starts = [
                i
                for i in range(extra + 1)
                if np.array_equal(padded[i : i + len(utterance)], utterance)
            ]
            assert len(starts) == 1 and starts[0] <= 100  # the speech itself is untouched
            around = np.concatenate([padded[: starts[0]], padded[starts[0] + len(utterance) :]])
            assert around.mean() < utterance.mean() - 3  # quieter than speech-level audio
        added.append(extra)
    assert 70 < padded_count < 130  # about half, as configured
    assert max(added) > 100  # both sides are used


def _tone_fbank(hz: float) -> np.ndarray:
    t = np.arange(16_000) / 16_000
    return compute_fbank((0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32))


def test_frequency_warp_moves_a_tone_where_the_stretched_tone_would_be() -> None:
    tone = _tone_fbank(1000.0)
    assert np.array_equal(warp_frequencies(tone, 1.0), tone)
    for alpha in (0.9, 1.1):
        warped = warp_frequencies(tone, alpha).mean(axis=0)
        expected = _tone_fbank(1000.0 * alpha).mean(axis=0)
        assert abs(int(warped.argmax()) - int(expected.argmax())) <= 1
        assert warped.argmax() != tone.mean(axis=0).argmax()  # it did move
    high = _tone_fbank(7500.0)  # near Nyquist, which the warp keeps fixed
    assert abs(int(warp_frequencies(high, 1.1).mean(0).argmax()) - int(high.mean(0).argmax())) <= 1


def test_band_limiting_matches_audio_low_passed_by_a_resampler() -> None:
    noise = (np.random.default_rng(0).standard_normal(32_000) * 0.1).astype(np.float32)
    eight_khz = soxr.resample(soxr.resample(noise, 16_000, 8_000), 8_000, 16_000)
    real = compute_fbank(eight_khz.astype(np.float32)).mean(axis=0)
    simulated = limit_bandwidth(compute_fbank(noise), 3_900.0, 200.0).mean(axis=0)
    assert np.abs(simulated[:55] - real[:55]).max() < 0.3  # the pass band (< 3.3 kHz) is kept
    assert np.abs(simulated[62:] - real[62:]).max() < 1.0  # above 4.3 kHz: the dither floor
    assert real[62:].max() < real[:55].min()  # which is far below the pass band


def test_equaliser_matches_audio_through_the_same_filter() -> None:
    noise = (np.random.default_rng(0).standard_normal(32_000) * 0.05).astype(np.float32)
    frames = compute_fbank(noise)
    # A flat gain is a louder recording: 6.02 dB is twice the amplitude.
    louder = colour_spectrum(frames, np.full(80, 20 * np.log10(2.0))).mean(axis=0)
    assert np.abs(louder - compute_fbank(2 * noise).mean(axis=0)).max() < 0.02
    # A first-order pre-emphasis filter, y[n] = x[n] - 0.9 x[n-1]: a steep tilt, -20 dB at DC
    # and +5.6 dB at Nyquist, given to the equaliser as its response at the bins' centres.
    filtered = np.append(noise[0], noise[1:] - 0.9 * noise[:-1]).astype(np.float32)
    omega = 2 * np.pi * _mel_bin_centres_hz() / 16_000
    response_db = 10 * np.log10(np.abs(1 - 0.9 * np.exp(-1j * omega)) ** 2)
    simulated = colour_spectrum(frames, response_db).mean(axis=0)
    real = compute_fbank(filtered).mean(axis=0)
    assert np.abs(simulated[8:] - real[8:]).max() < 0.15  # above ~250 Hz: within 0.7 dB
    assert real[-1] - real[8] > 3  # and the filter did tilt the spectrum by much more


def test_random_equaliser_is_smooth_bounded_and_varied() -> None:
    rng = random.Random(0)
    curves = np.stack([random_equaliser(rng, 10.0) for _ in range(200)])
    assert np.abs(curves).max() <= 10.0 and np.abs(curves).max() > 7.0
    assert np.abs(np.diff(curves, axis=1)).max() < 1.0  # dB per bin: no narrow notches
    assert np.std(curves[:, -1] - curves[:, 0]) > 3.0  # tilts of both signs and sizes
    assert np.array_equal(random_equaliser(random.Random(1), 0.0), np.zeros(80))


def test_frequency_warp_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="vtlp"):
        TrainConfig(vtlp_prob=1.5)
    with pytest.raises(ValueError, match="vtlp"):
        TrainConfig(vtlp_max_warp=0.6)
    with pytest.raises(ValueError, match="cutoff"):
        TrainConfig(min_cutoff_hz=5_000.0, max_cutoff_hz=4_000.0)
    with pytest.raises(ValueError, match="eq_prob"):
        TrainConfig(eq_prob=-0.1)


def test_several_manifests_train_as_their_utterances_one_after_the_other(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    entries = read_manifest(tiny_corpus / "train.jsonl")
    half = len(entries) // 2
    # Each manifest's audio paths are relative to its own folder, and the folders differ.
    (tmp_path / "corpus").symlink_to(tiny_corpus)
    (tmp_path / "elsewhere").mkdir()
    first, second = tmp_path / "first.jsonl", tmp_path / "elsewhere" / "second.jsonl"
    write_manifest(first, [replace(e, audio=f"corpus/{e.audio}") for e in entries[:half]])
    moved = [replace(e, audio=f"../corpus/{e.audio}") for e in entries[half:]]
    write_manifest(second, moved)
    whole = FeatureStore(tiny_corpus / "train.jsonl", tmp_path / "cache")
    both = FeatureStore([first, second], tmp_path / "cache")
    assert len(both) == len(whole) == len(entries)
    assert both.texts == whole.texts and both.groups == whole.groups
    for i in range(len(whole)):
        np.testing.assert_array_equal(both.features(i), whole.features(i))
        direct = compute_fbank(load_audio(tiny_corpus / entries[i].audio)).astype(np.float16)
        np.testing.assert_array_equal(whole.features(i), direct)
    # The cache is keyed by every manifest: another second manifest makes another store.
    write_manifest(second, moved[:-1])
    assert len(FeatureStore([first, second], tmp_path / "cache")) == len(entries) - 1


def _store_cmvn_and_vocabulary(
    corpus: Path, cache: Path
) -> tuple[FeatureStore, GlobalCmvn, CharVocabulary]:
    store = FeatureStore(corpus / "train.jsonl", cache)
    cmvn = GlobalCmvn.from_features(store.features(i).astype(np.float32) for i in range(4))
    return store, cmvn, CharVocabulary()


def test_every_augmentation_at_once_keeps_batches_finite_and_labels_intact(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    store, cmvn, vocabulary = _store_cmvn_and_vocabulary(tiny_corpus, tmp_path / "cache")
    augment = TrainConfig(vtlp_prob=1.0, bandlimit_prob=1.0, eq_prob=1.0, silence_prob=1.0)
    plain = make_batch(store, [0, 1, 2], cmvn, vocabulary, None, random.Random(0))
    batch = make_batch(store, [0, 1, 2], cmvn, vocabulary, augment, random.Random(0))
    assert torch.isfinite(batch.features).all()
    assert (batch.lengths > plain.lengths).all()  # silence was added around every utterance
    assert torch.equal(batch.targets, plain.targets)
    assert not torch.equal(batch.features[:, : plain.features.shape[1]], plain.features)


def test_continuous_batches_join_pairs_into_one_row_with_both_transcripts(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    store, cmvn, vocabulary = _store_cmvn_and_vocabulary(tiny_corpus, tmp_path / "cache")
    # Everything that draws at random off, so the rows can be compared with the plain batch.
    quiet = dict(silence_prob=0.0, freq_masks=0, time_masks=0)
    joined = make_batch(
        store, [0, 1, 2], cmvn, vocabulary, TrainConfig(concat_prob=1.0, **quiet), random.Random(0)
    )
    apart = make_batch(store, [0, 1, 2], cmvn, vocabulary, TrainConfig(**quiet), random.Random(0))
    # Three utterances make a pair and a single: two rows, the frames and labels all kept.
    assert joined.lengths.tolist() == [apart.lengths[0] + apart.lengths[1], apart.lengths[2]]
    first, second = (int(n) for n in apart.lengths[:2])
    torch.testing.assert_close(joined.features[0, :first], apart.features[0, :first])
    torch.testing.assert_close(
        joined.features[0, first : first + second], apart.features[1, :second]
    )
    pair = vocabulary.encode(f"{store.texts[0]} {store.texts[1]}")
    assert joined.target_lengths.tolist() == [len(pair), apart.target_lengths[2]]
    assert joined.targets[: len(pair)].tolist() == pair
    with pytest.raises(ValueError, match="concat_prob"):
        TrainConfig(concat_prob=1.5)


def test_consistency_batches_hold_every_row_twice_with_their_own_masks(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    store, cmvn, vocabulary = _store_cmvn_and_vocabulary(tiny_corpus, tmp_path / "cache")
    unmasked = TrainConfig(consistency_weight=0.2, silence_prob=0.0, freq_masks=0, time_masks=0)
    alone = replace(unmasked, consistency_weight=0.0)
    once = make_batch(store, [0, 1, 2], cmvn, vocabulary, alone, random.Random(0))
    twice = make_batch(store, [0, 1, 2], cmvn, vocabulary, unmasked, random.Random(0))
    # First copies, then second copies: without masks both are the plain rows.
    assert twice.lengths.tolist() == once.lengths.tolist() * 2
    assert twice.target_lengths.tolist() == once.target_lengths.tolist() * 2
    assert twice.targets.tolist() == once.targets.tolist() * 2
    torch.testing.assert_close(twice.features[:3], once.features)
    torch.testing.assert_close(twice.features[3:], once.features)
    # With masks, the copies of a row share everything but where they were masked.
    masked = replace(unmasked, freq_masks=2, freq_mask_bins=20, time_masks=2, silence_prob=1.0)
    batch = make_batch(store, [0, 1, 2], cmvn, vocabulary, masked, random.Random(1))
    first, second = batch.features[:3], batch.features[3:]
    assert torch.equal(batch.lengths[:3], batch.lengths[3:])
    assert not torch.equal(first, second)
    both_kept = (first != 0) & (second != 0)
    assert torch.equal(first[both_kept], second[both_kept])
    with pytest.raises(ValueError, match="consistency_weight"):
        TrainConfig(consistency_weight=-0.1)


def test_consistency_loss_is_each_copys_kl_from_the_other_over_valid_frames() -> None:
    torch.manual_seed(0)
    log_probs = torch.randn(4, 6, 5).log_softmax(-1).requires_grad_(True)
    lengths = torch.tensor([6, 3, 6, 3])  # rows 0 and 2 are copies, as are 1 and 3
    p = log_probs.detach().exp()
    expected = sum(
        (p[other, t] * (log_probs[other, t] - log_probs[row, t])).sum()
        for row, other in ((0, 2), (1, 3), (2, 0), (3, 1))
        for t in range(int(lengths[row]))
    )
    loss = consistency_loss(log_probs, lengths)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert log_probs.grad is not None and (log_probs.grad[1, 3:] == 0).all()  # padding ignored
    same = log_probs.detach()[:2].repeat(2, 1, 1)
    assert consistency_loss(same, lengths).abs() < 1e-6  # identical copies agree


def test_ctc_loss_adds_the_weighted_consistency_term(tiny_corpus: Path, tmp_path: Path) -> None:
    store, cmvn, vocabulary = _store_cmvn_and_vocabulary(tiny_corpus, tmp_path / "cache")
    config = TrainConfig(consistency_weight=0.5, silence_prob=0.0)
    batch = make_batch(store, [0, 1], cmvn, vocabulary, config, random.Random(2))
    torch.manual_seed(0)
    model = ConformerCTC(replace(TINY, vocab_size=len(vocabulary), dropout=0.0)).eval()
    plain = ctc_loss(model, batch, 4, 2)
    log_probs, out_lengths = model(batch.features, batch.lengths, 4, 2)
    extra = 0.5 * consistency_loss(log_probs, out_lengths) / len(batch.lengths)
    assert extra > 0  # the copies were masked differently, so their posteriors differ
    torch.testing.assert_close(ctc_loss(model, batch, 4, 2, 0.5), plain + extra)


def test_training_lowers_the_loss_resumes_and_writes_a_loadable_model(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    losses: list[float] = []
    epochs: list[float] = []

    def record(event: dict[str, float]) -> None:
        if "loss" in event:
            losses.append(event["loss"])
        else:
            epochs.append(event["epoch"])

    out = tmp_path / "run"
    train_asr(tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl", out, TINY, FAST, record)
    assert epochs == [1, 2, 3]
    steps_per_epoch = len(losses) // 3
    first, last = losses[:steps_per_epoch], losses[-steps_per_epoch:]
    assert sum(last) / len(last) < 0.8 * sum(first) / len(first)

    # Resume: two more epochs continue from the checkpoint, not from scratch.
    epochs.clear()
    final = train_asr(
        tiny_corpus / "train.jsonl",
        tiny_corpus / "dev.jsonl",
        out,
        TINY,
        replace(FAST, epochs=5),
        record,
    )
    assert epochs == [4, 5]
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 5 and len(state["history"]) == 5
    assert not list(out.glob(".*.tmp"))
    asr = load_model(final)
    assert asr.model.config == TINY and asr.info["history"][-1]["epoch"] == 5
    with pytest.raises(ValueError, match="trained with"):
        train_asr(
            tiny_corpus / "train.jsonl",
            tiny_corpus / "dev.jsonl",
            out,
            replace(TINY, num_layers=3),
            FAST,
        )


def test_the_released_weights_average_the_last_epochs(tiny_corpus: Path, tmp_path: Path) -> None:
    events: list[dict[str, float]] = []
    config = replace(FAST, average_epochs=2)
    final = train_asr(
        tiny_corpus / "train.jsonl",
        tiny_corpus / "dev.jsonl",
        tmp_path,
        TINY,
        config,
        events.append,
    )
    # Only the averaging window is kept on disk.
    assert sorted(p.name for p in tmp_path.glob("epoch-*")) == [
        "epoch-2.safetensors",
        "epoch-3.safetensors",
    ]
    second, third = (load_file(str(tmp_path / f"epoch-{e}.safetensors")) for e in (2, 3))
    released = load_model(final).model.state_dict()
    assert not torch.equal(second["head.weight"], third["head.weight"])  # a real average
    for name, value in released.items():
        torch.testing.assert_close(value, (second[name] + third[name]) / 2)
    history = load_model(final).info["history"]
    assert history[-1]["averaged_epochs"] == [2, 3] and history[-1]["dev_wer"] >= 0
    assert any("averaged_dev_wer" in event for event in events)


def test_a_bpe_vocabulary_trains_and_travels_in_the_model_file(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    config = replace(FAST, epochs=1, vocabulary="bpe-40")
    final = train_asr(
        tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl", tmp_path, TINY, config
    )
    asr = load_model(final)
    assert asr.model.config.vocab_size == len(asr.vocabulary) == 41
    assert asr.vocabulary.decode(asr.vocabulary.encode("the cat sat")) == "the cat sat"


def test_training_can_start_from_a_released_model(tiny_corpus: Path, tmp_path: Path) -> None:
    first = train_asr(
        tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl", tmp_path / "a", TINY, FAST
    )
    losses: list[float] = []
    train_asr(
        tiny_corpus / "train.jsonl",
        tiny_corpus / "dev.jsonl",
        tmp_path / "b",
        replace(TINY, num_layers=5),  # ignored: the released model's shape wins
        replace(FAST, epochs=1, curriculum_epochs=0, lr=1e-4),
        lambda event: losses.append(event["loss"]) if "loss" in event else None,
        init=first,
    )
    continued = load_model(tmp_path / "b" / "model.safetensors")
    assert continued.model.config == TINY
    assert (continued.cmvn.mean == load_model(first).cmvn.mean).all()
    fresh: list[float] = []
    train_asr(
        tiny_corpus / "train.jsonl",
        tiny_corpus / "dev.jsonl",
        tmp_path / "c",
        TINY,
        replace(FAST, epochs=1, curriculum_epochs=0, lr=1e-4),
        lambda event: fresh.append(event["loss"]) if "loss" in event else None,
    )
    assert losses[0] < fresh[0]  # it starts where the released model left off


def test_another_vocabulary_keeps_the_init_encoder_under_a_fresh_head(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    first = train_asr(
        tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl", tmp_path / "a", TINY, FAST
    )
    no_steps = replace(FAST, epochs=1, curriculum_epochs=0, lr=1e-12, warmup_steps=1)

    def continue_with(vocabulary: str, out: str) -> Path:
        config = replace(no_steps, vocabulary=vocabulary)
        manifests = (tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl")
        return train_asr(*manifests, tmp_path / out, TINY, config, init=first)

    swapped = continue_with("bpe-40", "b")
    before, after = load_model(first), load_model(swapped)
    assert (
        len(before.vocabulary) == 29
        and len(after.vocabulary) == after.model.config.vocab_size == 41
    )
    old, new = before.model.state_dict(), after.model.state_dict()
    assert set(old) == set(new)
    for name in old:
        if name.startswith("head."):
            assert old[name].shape != new[name].shape
        else:  # the encoder, untouched by a learning rate of 1e-12
            torch.testing.assert_close(new[name], old[name], rtol=0, atol=1e-6)
    kept = continue_with("char", "c")  # naming the init model's own vocabulary keeps its head
    torch.testing.assert_close(
        load_model(kept).model.head.weight, before.model.head.weight, rtol=0, atol=1e-6
    )


def _train_command(manifest: Path, dev: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "asr",
        "--manifest",
        str(manifest),
        "--dev",
        str(dev),
        "--out",
        str(out),
        *extra,
    ]


def test_cli_trains_under_torchrun_with_two_processes(tiny_corpus: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    train = {"epochs": 1, "max_frames": 3000, "warmup_steps": 2}
    config.write_text(json.dumps({"model": TINY.to_dict(), "train": train}))
    out, export = tmp_path / "run", tmp_path / "model.safetensors"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a free rendezvous port, so back-to-back runs cannot clash on 29500.
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
    ]
    command = [
        *launcher,
        "edgestream",
        *_train_command(
            tiny_corpus / "train.jsonl",
            tiny_corpus / "dev.jsonl",
            out,
            "--config",
            str(config),
            "--export",
            str(export),
        ),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-2000:]
    assert "2 processes" in proc.stderr and "dev WER" in proc.stderr
    assert load_model(export).model.config == TINY


def test_cli_refuses_bad_training_input(tiny_corpus: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgestream.cli import app

    runner = CliRunner()
    dev = tiny_corpus / "dev.jsonl"
    missing = runner.invoke(app, _train_command(tmp_path / "no.jsonl", dev, tmp_path))
    assert missing.exit_code == 2 and "manifest" in missing.output
    train = str(tiny_corpus / "train.jsonl")
    second_missing = runner.invoke(
        app, [*_train_command(train, dev, tmp_path), "--manifest", str(tmp_path / "two.jsonl")]
    )
    assert second_missing.exit_code == 2 and "two.jsonl" in second_missing.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"optimizer": {}}))
    unknown = runner.invoke(
        app, _train_command(tiny_corpus / "train.jsonl", dev, tmp_path, "--config", str(bad))
    )
    assert unknown.exit_code == 2 and "unknown sections" in unknown.output


@pytest.mark.parametrize("extra", [1, 2, 3, 5])
def test_deepened_spreads_near_identity_blocks_between_the_originals(extra: int) -> None:
    torch.manual_seed(0)
    model = ConformerCTC(replace(TINY, num_layers=2)).eval()
    for block in model.blocks:  # as trained: a block's final norm scales and shifts
        nn.init.normal_(block.norm.weight, 1.0, 0.3)
        nn.init.normal_(block.norm.bias, 0.0, 0.3)
    grown = deepened(model, extra).eval()
    assert grown.config.num_layers == len(grown.blocks) == 2 + extra
    originals = [grown.blocks[i] for i in range(len(grown.blocks)) if _is_copy_of_a(grown, i)]
    assert len(originals) == 2
    first_new = 1 if extra >= 2 else 2  # evenly: at least one after block 0 when there are 2+
    new = grown.blocks[first_new]
    assert not _is_copy_of_a(grown, first_new)
    x = torch.randn(1, 7, TINY.d_model) * 3 + 1
    cache = grown.empty_cache()[first_new]
    rope = grown._rope(0, 7)
    mask = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    out, _ = new(x, rope, mask, cache)
    torch.testing.assert_close(out, F.layer_norm(x, (TINY.d_model,)))  # it only normalises
    for name, value in model.state_dict().items():  # the subsampling and head carry over
        if not name.startswith("blocks."):
            torch.testing.assert_close(grown.state_dict()[name], value)
    assert model.config.num_layers == 2  # the model given is left alone


def _is_copy_of_a(grown: ConformerCTC, i: int) -> bool:
    """Whether block i still has its branches (an original) rather than zeroed ones (new)."""
    return bool(grown.blocks[i].ff_first.down.weight.abs().sum() > 0)


def test_training_can_deepen_its_init_model_and_resume(tiny_corpus: Path, tmp_path: Path) -> None:
    manifests = (tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl")
    first = train_asr(*manifests, tmp_path / "a", TINY, FAST)
    with pytest.raises(ValueError, match="grow_layers"):
        train_asr(*manifests, tmp_path / "x", TINY, replace(FAST, grow_layers=2))
    config = replace(FAST, epochs=1, curriculum_epochs=0, lr=1e-12, warmup_steps=1, grow_layers=2)
    grown = load_model(train_asr(*manifests, tmp_path / "b", TINY, config, init=first))
    before = load_model(first).model.state_dict()
    after = grown.model.state_dict()
    assert grown.model.config == replace(TINY, num_layers=4)
    # Blocks 0 and 1 went to 0 and 2 (one new block after each), untouched at lr 1e-12.
    for name, value in before.items():
        moved = name.replace("blocks.1.", "blocks.2.")
        torch.testing.assert_close(after[moved], value, rtol=0, atol=1e-6)
    assert after["blocks.1.ff_first.down.weight"].abs().max() < 1e-6
    # The checkpoint holds the deepened shape, so a longer schedule resumes from it.
    longer = replace(config, epochs=2)
    resumed = load_model(train_asr(*manifests, tmp_path / "b", TINY, longer, init=first))
    assert resumed.model.config.num_layers == 4


def test_a_fine_tune_can_override_the_init_models_dropout(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    manifests = (tiny_corpus / "train.jsonl", tiny_corpus / "dev.jsonl")
    first = train_asr(*manifests, tmp_path / "a", replace(TINY, dropout=0.3), FAST)
    assert load_model(first).model.config.dropout == 0.3
    config = replace(FAST, epochs=1, curriculum_epochs=0, lr=1e-4, dropout=0.0)
    tuned = load_model(train_asr(*manifests, tmp_path / "b", TINY, config, init=first)).model
    assert tuned.config.dropout == 0.0
    # In training mode, without dropout, two passes over the same input agree exactly.
    tuned.train()
    features, lengths = torch.randn(1, 120, 80), torch.tensor([120])
    torch.testing.assert_close(tuned(features, lengths), tuned(features, lengths), rtol=0, atol=0)
    dropped = ConformerCTC(replace(tuned.config, dropout=0.3))  # with dropout the check fails
    dropped.load_state_dict(tuned.state_dict())
    dropped.train()
    assert not torch.equal(dropped(features, lengths)[0], dropped(features, lengths)[0])
    with pytest.raises(ValueError, match="dropout"):
        replace(FAST, dropout=1.0)
