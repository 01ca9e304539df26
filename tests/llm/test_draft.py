"""The draft-model baseline: a truncated copy of the base, its training, files and decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgestream.llm.baselines import generate_draft
from edgestream.llm.distill import distill, load_shards
from edgestream.llm.draft import load_draft, save_draft, train_draft, truncated_copy
from edgestream.llm.engine import Sampling, generate_ar
from edgestream.llm.int8 import Int8Linear, int8_available
from edgestream.llm.loading import load_language_model
from edgestream.llm.model import Transformer
from edgestream.llm.tasks import TaskPrompt
from edgestream.llm.train import TrainConfig
from tests.conftest import TINY_CORPUS, tiny_llama


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_hf(tiny_llama(max_position=128))


def _prompt(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_truncated_copy_shares_the_embedding_and_copies_the_layers(model: Transformer) -> None:
    draft = truncated_copy(model, 1)
    assert draft.tok_embeddings is model.tok_embeddings and draft.output is model.output
    assert draft.layers[0] is not model.layers[0]
    torch.testing.assert_close(
        draft.layers[0].attention.wqkv.weight, model.layers[0].attention.wqkv.weight
    )
    with pytest.raises(ValueError, match="n_layers must be in"):
        truncated_copy(model, model.config.n_layers)


@pytest.mark.parametrize("num_draft", [1, 3, 6])
@pytest.mark.parametrize("seed", range(3))
def test_draft_decoding_equals_ar(model: Transformer, num_draft: int, seed: int) -> None:
    draft = truncated_copy(model, 1)
    prompt = _prompt(10 + seed, seed)
    ar = generate_ar(model, prompt, 40)
    out = generate_draft(model, draft, prompt, 40, num_draft=num_draft)
    assert out.token_ids == ar.token_ids
    assert out.forward_passes <= ar.forward_passes
    sampling = Sampling(0.9, seed=seed)
    sampled = generate_draft(model, draft, prompt, 40, num_draft=num_draft, sampling=sampling)
    assert sampled.token_ids == generate_ar(model, prompt, 40, sampling=sampling).token_ids


def test_a_draft_equal_to_the_base_is_always_accepted() -> None:
    # The draft is the first two of three layers; with the third layer's residual branches
    # zeroed the base computes exactly what its draft does, so every draft is accepted.
    base = Transformer.from_hf(tiny_llama(max_position=128))
    with torch.no_grad():
        last = base.layers[-1]
        last.attention.wo.weight.zero_()
        last.feed_forward.w_down.weight.zero_()
    draft = truncated_copy(base, base.config.n_layers - 1)
    out = generate_draft(base, draft, _prompt(12, 1), 30, num_draft=4)
    assert out.mean_accepted == pytest.approx(30 / out.forward_passes)
    assert out.forward_passes <= 1 + -(-29 // 5)  # prefill, then 5 tokens per pass


def test_stops_and_budgets_are_exact(model: Transformer) -> None:
    draft = truncated_copy(model, 1)
    prompt = _prompt(20, 3, vocab=8)
    free = generate_ar(model, prompt, 40).token_ids
    assert generate_draft(model, draft, prompt, 5).token_ids == free[:5]
    stop = free[12]
    stopped = generate_draft(model, draft, prompt, 40, stop_ids={stop})
    assert stopped.token_ids == free[: free.index(stop) + 1] and stopped.finish_reason == "stop"


def test_draft_learns_saves_and_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    prompts = [TaskPrompt("t", str(i), text) for i, text in enumerate(TINY_CORPUS * 3)]
    records = load_shards(distill(lm, prompts, tmp_path / "distill", 1, 24, batch_size=4))
    log: list[tuple] = []
    config = TrainConfig(
        steps=40,
        batch_sequences=4,
        positions_per_sequence=8,
        lr=1e-2,
        warmup_steps=5,
        checkpoint_every=10,
    )
    draft = train_draft(
        lm.model, records, 1, config, tmp_path / "run", "tiny", lambda *a: log.append(a)
    )
    first = sum(loss for _, loss, _ in log[:8]) / 8
    last = sum(loss for _, loss, _ in log[-8:]) / 8
    assert last < 0.8 * first
    base_layer = lm.model.layers[0].attention.wqkv.weight
    assert not torch.equal(draft.layers[0].attention.wqkv.weight, base_layer)  # trained a copy
    path = tmp_path / "draft.safetensors"
    save_draft(draft, path, {"note": "test"})
    packed = load_language_model(str(tiny_model_dir))  # packed weights, as decoding loads them
    loaded, info = load_draft(path, packed.model)
    assert info == {"note": "test"}
    prompt = packed.encode_prompt(TINY_CORPUS[0])
    expected = generate_ar(packed.model, prompt, 20, packed.stop_ids).token_ids
    assert generate_draft(packed.model, loaded, prompt, 20, packed.stop_ids).token_ids == expected
    if int8_available():  # int8 drafts (`--draft-dtype int8`): other drafts, the same output
        base_head = packed.model.output
        low, _ = load_draft(path, packed.model, int8=True)
        assert isinstance(low.output, Int8Linear) and packed.model.output is base_head
        assert isinstance(low.layers[0].attention.wqkv, Int8Linear)
        assert generate_draft(packed.model, low, prompt, 20, packed.stop_ids).token_ids == expected
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a draft model file"):
        load_draft(bad, packed.model)
