"""Medusa heads (the baseline): initialisation, learning on distilled data, saving, decoding."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from edgestream.llm.baselines import generate_medusa
from edgestream.llm.distill import distill, load_shards
from edgestream.llm.engine import generate_ar
from edgestream.llm.int8 import int8_available
from edgestream.llm.loading import load_language_model
from edgestream.llm.medusa import (
    Int8MedusaHeads,
    MedusaConfig,
    MedusaHeads,
    load_medusa,
    save_medusa,
    train_medusa,
)
from edgestream.llm.tasks import TaskPrompt
from edgestream.llm.tree import TreeShape
from tests.conftest import TINY_CORPUS

CONFIG = MedusaConfig(n_heads=3, draft_vocab_size=64)


@pytest.fixture(scope="module")
def records(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate(TINY_CORPUS * 3)]
    shards = distill(lm, prompts, tmp_path_factory.mktemp("distill"), 1, 24, batch_size=4)
    return load_shards(shards)


def test_untrained_heads_start_as_the_base_lm_head(tiny_model_dir: Path) -> None:
    model = load_language_model(str(tiny_model_dir), pack=False).model
    heads = MedusaHeads(model.config, MedusaConfig(n_heads=2, draft_vocab_size=0))
    heads.init_from(model, None)
    hidden = torch.randn(5, model.config.dim)
    # Zero block weights and biases: x + silu(0) = x, so every head is the base LM head.
    expected = model.output(hidden)
    logits = heads(hidden)
    for k in range(2):
        torch.testing.assert_close(logits[:, k], expected)
    full = heads.full_vocab_parameters()
    assert full == heads.extra_parameters()  # no draft vocabulary: the original's size


def test_heads_learn_and_resume(tiny_model_dir: Path, records: list[dict], tmp_path: Path) -> None:
    from edgestream.llm.train import TrainConfig

    model = load_language_model(str(tiny_model_dir), pack=False).model
    log: list[tuple] = []
    config = TrainConfig(
        steps=60,
        batch_sequences=4,
        positions_per_sequence=8,
        lr=1e-2,
        warmup_steps=5,
        checkpoint_every=10,
    )
    heads = train_medusa(
        model, records, 1, CONFIG, config, tmp_path, "tiny", lambda *a: log.append(a)
    )
    first = sum(loss for _, loss, _ in log[:10]) / 10
    last = sum(loss for _, loss, _ in log[-10:]) / 10
    assert last < 0.8 * first
    assert len(log[0][2]) == CONFIG.n_heads  # top-1 accuracy per head
    # Resuming continues the step count from the checkpoint.
    more = TrainConfig(**{**config.__dict__, "steps": 65})
    log.clear()
    train_medusa(model, records, 1, CONFIG, more, tmp_path, "tiny", lambda *a: log.append(a))
    assert [step for step, *_ in log] == [61, 62, 63, 64, 65]
    save_medusa(heads, tmp_path / "heads.safetensors", {"note": "test"})
    loaded, info = load_medusa(tmp_path / "heads.safetensors", model)
    assert info == {"note": "test"}
    torch.testing.assert_close(loaded.head_weight, heads.head_weight)
    torch.testing.assert_close(loaded.draft_vocab, heads.draft_vocab)
    # Trained heads continue training from where they are (their configuration wins), loaded
    # in float32 whatever the base model's dtype.
    given, _ = load_medusa(tmp_path / "heads.safetensors", model.to(torch.bfloat16), torch.float32)
    assert given.head_weight.dtype == torch.float32
    tiny_lr = TrainConfig(steps=1, batch_sequences=2, positions_per_sequence=4, lr=1e-12)
    other = MedusaConfig(n_heads=2, draft_vocab_size=32)
    continued = train_medusa(
        model.float(), records, 1, other, tiny_lr, tmp_path / "more", "tiny", None, given
    )
    assert continued.config == CONFIG
    torch.testing.assert_close(continued.draft_vocab, heads.draft_vocab)
    torch.testing.assert_close(continued.head_weight, heads.head_weight, rtol=0, atol=1e-9)


def test_loading_rejects_other_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load_language_model(str(tiny_model_dir), pack=False).model
    with pytest.raises(FileNotFoundError, match="do not exist"):
        load_medusa(tmp_path / "missing.safetensors", model)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a Medusa heads file"):
        load_medusa(bad, model)


@pytest.mark.parametrize("shape", [TreeShape(), TreeShape(top_k=(1, 1, 1), max_nodes=4)])
def test_medusa_decoding_equals_ar_with_untrained_heads(
    tiny_model_dir: Path, shape: TreeShape
) -> None:
    lm = load_language_model(str(tiny_model_dir))
    heads = MedusaHeads(lm.model.config, CONFIG)
    torch.manual_seed(0)
    with torch.no_grad():  # random heads: lossless must not depend on their quality
        for p in heads.parameters():
            p.normal_(0, 0.5)
    low = [copy.deepcopy(heads).to(torch.bfloat16)]  # drafting in bfloat16 (`--draft-dtype`)
    if int8_available():
        low.append(Int8MedusaHeads(heads))
    for text in TINY_CORPUS[:4]:
        prompt = lm.encode_prompt(text)
        ar = generate_ar(lm.model, prompt, 40, lm.stop_ids)
        medusa = generate_medusa(lm.model, heads, prompt, 40, lm.stop_ids, shape)
        assert medusa.token_ids == ar.token_ids
        assert medusa.forward_passes <= ar.forward_passes
        for drafter in low:
            drafted = generate_medusa(lm.model, drafter, prompt, 40, lm.stop_ids, shape)
            assert drafted.token_ids == ar.token_ids


@pytest.mark.skipif(not int8_available(), reason="this PyTorch build has no int8 engine")
@torch.inference_mode()
def test_int8_heads_draft_what_the_float32_heads_draft(tiny_model_dir: Path) -> None:
    model = load_language_model(str(tiny_model_dir), pack=False).model
    torch.manual_seed(0)
    heads = MedusaHeads(model.config, CONFIG)
    heads.init_from(model, torch.randperm(model.config.vocab_size)[:64])
    with torch.no_grad():
        heads.block_weight.normal_(0, 0.05)
    int8 = Int8MedusaHeads(heads)
    hidden = torch.randn(5, model.config.dim)
    expected, got = heads(hidden), int8(hidden)
    assert got.dtype == torch.float32 and got.shape == expected.shape == (5, 3, 64)
    error = (got - expected).norm() / expected.norm()
    assert 0 < error < 0.02, error  # int8 rounding, no more (and not none: it ran)
    assert torch.equal(int8.top_k(hidden[0], 4)[0][:, 0], heads.top_k(hidden[0], 4)[0][:, 0])
