"""Shared mode: LoRA + streams fine-tuned together, adapters merged for decoding, lossless SS
relative to the fine-tuned model, and the next-token-only baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgestream.llm.engine import generate_ar, generate_ss
from edgestream.llm.loading import load_language_model
from edgestream.llm.lora import LoRAConfig, LoRALinear, adapter_weights, add_lora, merge_lora
from edgestream.llm.model import Transformer
from edgestream.llm.msa import StreamConfig
from edgestream.llm.shared import (
    load_adapter,
    read_adapter,
    save_adapter,
    task_records,
    train_shared,
)
from edgestream.llm.tasks import TaskPrompt
from edgestream.llm.train import TrainConfig
from tests.conftest import tiny_llama

STREAMS = StreamConfig(2, n_stream_layers=1, adapter_rank=4, next_token_rank=4, draft_vocab_size=64)
CONFIG = TrainConfig(
    steps=80,
    batch_sequences=4,
    positions_per_sequence=8,
    lr=1e-2,
    warmup_steps=4,
    checkpoint_every=20,
)
PAIRS = [
    ("Summarize: the quick brown fox jumps over the lazy dog", "a fox jumps over a dog"),
    ("What is the capital of France?", "paris is the capital of france."),
    ("Count the users named ada.", "select count(*) from users where name = 'ada';"),
    ("Describe speculative streaming.", "it drafts and verifies tokens in one forward pass"),
]


def _prompts() -> list[TaskPrompt]:
    return [TaskPrompt("t", str(i), q, a) for i, (q, a) in enumerate(PAIRS * 2)]


def test_merged_lora_computes_what_the_adapters_did() -> None:
    model = Transformer.from_hf(tiny_llama(max_position=64))
    adapters = add_lora(model, LoRAConfig(rank=4, alpha=8))
    with torch.no_grad():
        for module in adapters.values():
            module.up.normal_(0, 0.1)  # a trained-looking, non-zero update
    tokens = torch.randint(3, 300, (1, 12))
    with_adapters = model(tokens, model.new_cache(12))
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(
        model(tokens, model.new_cache(12)), with_adapters, rtol=1e-4, atol=1e-4
    )


def test_records_hold_prompt_then_reference_then_stop(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    records = task_records(lm, [*_prompts()[:2], TaskPrompt("t", "x", "no answer")], 8)
    assert len(records) == 2  # the prompt without a reference is left out
    record = records[0]
    assert record["tokens"][: record["prompt_length"]].tolist() == lm.encode_prompt(PAIRS[0][0])
    assert int(record["tokens"][-1]) in lm.stop_ids
    with pytest.raises(ValueError, match="no reference answers"):
        task_records(lm, [TaskPrompt("t", "x", "no answer")], 8)


@pytest.mark.parametrize("with_streams", [True, False])
def test_shared_training_learns_and_its_adapter_decodes_losslessly(
    tiny_model_dir: Path, tmp_path: Path, with_streams: bool
) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    records = task_records(lm, _prompts(), 16)
    log: list[tuple] = []
    lora = LoRAConfig(rank=4, alpha=8)
    streams_config = STREAMS if with_streams else None
    weights = train_shared(
        lm.model, records, lora, streams_config, CONFIG, tmp_path, "tiny", lambda *a: log.append(a)
    )
    first = sum(loss for _, loss, _ in log[:8]) / 8
    last = sum(loss for _, loss, _ in log[-8:]) / 8
    assert last < 0.85 * first
    assert log[-1][2][0] > log[0][2][0]  # next-token accuracy rose
    assert len(log[-1][2]) == (1 + STREAMS.n_streams if with_streams else 1)
    prompt = lm.encode_prompt(PAIRS[1][0])
    tuned = generate_ar(lm.model, prompt, 12, lm.stop_ids).token_ids  # the model with adapters
    path = tmp_path / "adapter.safetensors"
    save_adapter(weights, lora, path, {"task": "t"})

    fresh = load_language_model(str(tiny_model_dir), pack=False)
    base = generate_ar(fresh.model, prompt, 12, fresh.stop_ids).token_ids
    streams, info = load_adapter(path, fresh)
    assert info == {"task": "t"} and (streams is not None) == with_streams
    merged = generate_ar(fresh.model, prompt, 12, fresh.stop_ids).token_ids
    assert merged == tuned and merged != base  # fine-tuning changed what the model says
    if streams is not None:
        ss = generate_ss(fresh.model, streams, prompt, 12, fresh.stop_ids)
        assert ss.token_ids == merged


def test_adapter_errors_are_clear(tiny_model_dir: Path, tmp_path: Path) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_adapter(tmp_path / "none.safetensors", lm)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not an adapter file"):
        load_adapter(bad, lm)
    packed = load_language_model(str(tiny_model_dir))
    weights = train_shared(
        load_language_model(str(tiny_model_dir), pack=False).model,
        task_records(lm, _prompts(), 8),
        LoRAConfig(rank=2, alpha=4),
        None,
        TrainConfig(steps=1, batch_sequences=2, positions_per_sequence=4, warmup_steps=1),
        tmp_path / "run",
        "tiny",
    )
    save_adapter(weights, LoRAConfig(rank=2, alpha=4), tmp_path / "a.safetensors", {})
    with pytest.raises(ValueError, match="pack=False"):
        load_adapter(tmp_path / "a.safetensors", packed)


def test_lora_can_start_from_an_adapter_of_the_same_shape(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    records = task_records(lm, _prompts(), 8)
    config = TrainConfig(steps=2, batch_sequences=2, positions_per_sequence=4, warmup_steps=1)
    lora = LoRAConfig(rank=2, alpha=4)
    first = train_shared(lm.model, records, lora, None, config, tmp_path / "a", "tiny")
    save_adapter(first, lora, tmp_path / "a.safetensors", {})
    start = read_adapter(tmp_path / "a.safetensors")
    frozen = TrainConfig(**{**config.__dict__, "steps": 1, "lr": 0.0})
    fresh = load_language_model(str(tiny_model_dir), pack=False).model
    again = train_shared(
        fresh, records, lora, None, frozen, tmp_path / "b", "tiny", None, None, start.lora
    )
    for key, tensor in adapter_weights(again.lora).items():
        assert torch.equal(tensor, start.lora[key])  # nothing moved at lr 0: the start was loaded
    assert any(t.abs().sum() > 0 for k, t in start.lora.items() if k.endswith(".up"))
    other = load_language_model(str(tiny_model_dir), pack=False).model
    with pytest.raises(ValueError, match="does not fit"):
        train_shared(
            other,
            records,
            LoRAConfig(rank=3, alpha=6),
            None,
            frozen,
            tmp_path / "c",
            "t",
            init_lora=start.lora,
        )


def test_shared_streams_can_start_from_trained_ones(tiny_model_dir: Path, tmp_path: Path) -> None:
    from edgestream.llm.msa import SpeculativeStreams

    lm = load_language_model(str(tiny_model_dir), pack=False)
    start = SpeculativeStreams(lm.model.config, STREAMS)
    with torch.no_grad():
        start.embeddings.normal_(0, 1.0)
        start.draft_vocab.copy_(torch.arange(64).flip(0))
    before = start.embeddings.detach().clone()
    config = TrainConfig(steps=3, batch_sequences=2, positions_per_sequence=4, warmup_steps=1)
    weights = train_shared(
        lm.model,
        task_records(lm, _prompts(), 8),
        LoRAConfig(2, 4),
        None,
        config,
        tmp_path,
        "tiny",
        init_streams=start,
    )
    assert weights.streams is start and weights.streams.config == STREAMS
    assert torch.equal(start.draft_vocab, torch.arange(64).flip(0))  # kept, not recounted
    assert not torch.equal(start.embeddings, before)  # and trained further
    torch.testing.assert_close(start.embeddings, before, atol=0.1, rtol=0)  # from where it was


def test_the_seed_alone_decides_a_fine_tune(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`train streams --seed` (TrainConfig.seed): the same seed repeats a run bit for bit, so
    a rerun with another seed measures the run's luck and nothing else."""
    records = task_records(load_language_model(str(tiny_model_dir), pack=False), _prompts(), 8)

    def adapters(seed: int, run: str) -> dict[str, torch.Tensor]:  # a run folder each: no resume
        config = TrainConfig(
            steps=2, batch_sequences=2, positions_per_sequence=4, warmup_steps=1, seed=seed
        )
        model = load_language_model(str(tiny_model_dir), pack=False).model
        lora = LoRAConfig(rank=2, alpha=4)
        weights = train_shared(model, records, lora, None, config, tmp_path / run, "t")
        return {k: v.detach().clone() for k, v in adapter_weights(weights.lora).items()}

    first, again, other = adapters(0, "first"), adapters(0, "again"), adapters(1, "other")
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)
