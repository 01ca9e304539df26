"""Parity of our decoder with transformers' Llama, and the KV cache's roll-back and compaction."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgestream.llm.model import (
    KVCache,
    ModelConfig,
    PackedLinear,
    Transformer,
    can_pack_weights,
    causal_mask,
    grouped_query_attention,
    packed_or_plain,
)
from tests.conftest import tiny_llama, tiny_llama_config


@pytest.fixture(scope="module")
def hf_model() -> object:
    return tiny_llama()


@pytest.fixture(scope="module")
def ours(hf_model: object) -> Transformer:
    return Transformer.from_hf(hf_model)


def _tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_logits_match_transformers(hf_model: object, ours: Transformer) -> None:
    tokens = _tokens(20)
    expected = hf_model(tokens).logits
    got = ours(tokens, ours.new_cache(32))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_incremental_decoding_matches_full_forward(ours: Transformer) -> None:
    tokens = _tokens(24, seed=1)
    full = ours(tokens, ours.new_cache(24))
    cache = ours.new_cache(24)
    pieces = [ours(tokens[:, :10], cache)]  # prefill, then one token at a time, then a chunk
    pieces += [ours(tokens[:, i : i + 1], cache) for i in range(10, 18)]
    pieces.append(ours(tokens[:, 18:], cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 24


@torch.inference_mode()
def test_rollback_then_redecode_is_identical(ours: Transformer) -> None:
    tokens = _tokens(16, seed=2)
    cache = ours.new_cache(32)
    ours(tokens[:, :12], cache)
    first = ours(tokens[:, 12:], cache)
    ours(_tokens(5, seed=3), cache)  # a wrong continuation, to be forgotten
    cache.rollback(12)
    again = ours(tokens[:, 12:], cache)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    with pytest.raises(ValueError, match="rollback length"):
        cache.rollback(cache.length + 1)


@torch.inference_mode()
def test_tree_verification_then_compaction_equals_sequential(ours: Transformer) -> None:
    """Verify a 2-branch draft tree in one call with an explicit mask, keep one branch.

    Tree after a prefix of length P (slots P.. in flattened order):
        slot P+0: a (depth 1)      slot P+1: b (depth 1)
        slot P+2: a->c (depth 2)   slot P+3: b->d (depth 2)
    Accepting the branch b, d must leave the cache as if b, d had been decoded one by one.
    """
    prefix, (a, b, c, d) = _tokens(8, seed=4), (11, 12, 13, 14)
    P = prefix.shape[1]
    cache = ours.new_cache(32)
    ours(prefix, cache)
    tree = torch.tensor([[a, b, c, d]])
    positions = torch.tensor([P, P, P + 1, P + 1])  # RoPE position = depth, not slot
    parent = [-1, -1, 0, 1]
    mask = torch.zeros(4, P + 4, dtype=torch.bool)
    mask[:, :P] = True
    for node in range(4):
        ancestor = node
        while ancestor != -1:
            mask[node, P + ancestor] = True
            ancestor = parent[ancestor]
    tree_logits = ours(tree, cache, positions=positions, mask=mask)
    cache.compact(torch.tensor([P + 1, P + 3]), start=P)
    next_after_tree = ours(torch.tensor([[5]]), cache)

    seq_cache = ours.new_cache(32)
    ours(prefix, seq_cache)
    seq_logits = ours(torch.tensor([[b, d, 5]]), seq_cache)
    torch.testing.assert_close(tree_logits[:, [1, 3]], seq_logits[:, :2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(next_after_tree[:, 0], seq_logits[:, 2], rtol=1e-5, atol=1e-5)
    assert cache.length == P + 3


def test_compaction_rejects_slots_outside_the_new_range(ours: Transformer) -> None:
    cache = ours.new_cache(16)
    cache.length = 10
    with pytest.raises(ValueError, match="slots must lie"):
        cache.compact(torch.tensor([2, 9]), start=5)


def test_cache_capacity_is_enforced(ours: Transformer) -> None:
    cache = ours.new_cache(8)
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        ours(_tokens(9), cache)


@pytest.mark.skipif(not can_pack_weights(), reason="this PyTorch build has no oneDNN")
@torch.inference_mode()
def test_packed_weights_match_plain(hf_model: object, ours: Transformer) -> None:
    packed = Transformer.from_hf(hf_model).pack_weights()
    tokens = _tokens(12, seed=5)
    plain_logits = ours(tokens, ours.new_cache(12))
    torch.testing.assert_close(
        packed(tokens, packed.new_cache(12)), plain_logits, rtol=1e-4, atol=1e-4
    )


@pytest.mark.skipif(not can_pack_weights(), reason="this PyTorch build has no oneDNN")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_layers_give_their_plain_weight_back(dtype: torch.dtype) -> None:
    linear = torch.nn.Linear(24, 40, bias=False).to(dtype)
    layer = packed_or_plain(linear)
    if layer is linear:  # oneDNN packs bfloat16 only on AVX-512 or AVX-NE-CONVERT CPUs
        assert dtype == torch.bfloat16
        pytest.skip("this CPU cannot pack bfloat16 weights; the layer stays plain")
    assert isinstance(layer, PackedLinear)
    assert torch.equal(layer.plain_weight(), linear.weight.detach())


@torch.inference_mode()
def test_bfloat16_follows_transformers_bfloat16(hf_model: object) -> None:
    tokens = _tokens(16, seed=6)
    hf_bf16 = tiny_llama().to(torch.bfloat16)
    ours_bf16 = Transformer.from_hf(hf_model, torch.bfloat16)
    got = ours_bf16(tokens, ours_bf16.new_cache(16))
    expected = hf_bf16(tokens).logits.float()
    assert got.dtype == torch.float32
    # bfloat16 keeps ~3 significant digits; compare with a matching tolerance.
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize(("T", "masked"), [(1, False), (1, True), (5, True)])
def test_folded_query_heads_attend_like_grouped_query_attention(
    dtype: torch.dtype, heads: tuple[int, int], T: int, masked: bool
) -> None:
    n_heads, n_kv_heads = heads
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, n_heads, T, 16, generator=g).to(dtype)
    cache = torch.randn(2, 2, n_kv_heads, 40, 16, generator=g).to(dtype)
    keys, values = cache[0, :, :, :33], cache[1, :, :, :33]  # a filled part of a longer cache
    # A tree-like mask, different per batch row and per query, so misplaced rows show.
    mask = torch.rand(2, 1, T, 33, generator=g) < 0.6 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query sees something
    expected = F.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=mask, enable_gqa=True
    )
    got = grouped_query_attention(q, keys, values, mask)
    assert got.shape == expected.shape and got.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


def test_config_refuses_other_architectures() -> None:
    config = tiny_llama_config()
    config.model_type = "gpt2"
    with pytest.raises(ValueError, match="expected a Llama-family model"):
        ModelConfig.from_hf(config)


def test_causal_mask_polarity() -> None:
    mask = causal_mask(torch.tensor([0, 1]), 2)
    assert mask.tolist() == [[True, False], [True, True]]


def test_kv_cache_is_preallocated() -> None:
    config = ModelConfig.from_hf(tiny_llama_config())
    cache = KVCache(config, capacity=10)
    assert cache.k[0].shape == (1, config.n_kv_heads, 10, config.head_dim)
    assert len(cache.k) == config.n_layers and cache.length == 0
