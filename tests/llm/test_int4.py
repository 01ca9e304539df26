"""4-bit (Q4_1) linear layers: the kernel's product, the GGUF reader, and q4_1 models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgestream.llm.int4 import (
    GROUP,
    Q4_1,
    Int4Linear,
    int4_available,
    read_q4_1,
    rope_row_order,
    use_q4_1_linears,
)
from tests.conftest import needs_smollm2

needs_int4 = pytest.mark.skipif(not int4_available(), reason="no int4 CPU kernel in this PyTorch")


def random_blocks(out_features: int, in_features: int, seed: int) -> Q4_1:
    generator = torch.Generator().manual_seed(seed)
    groups = in_features // GROUP
    return Q4_1(
        torch.randint(0, 16, (out_features, in_features), generator=generator, dtype=torch.uint8),
        torch.rand(out_features, groups, generator=generator) * 0.01,
        torch.randn(out_features, groups, generator=generator) * 0.05,
    )


@needs_int4
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    out_blocks=st.integers(1, 4),
    in_groups=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_int4_linear_is_the_product_with_bfloat16_inputs_and_scales(
    rows: int, out_blocks: int, in_groups: int, seed: int
) -> None:
    blocks = random_blocks(16 * out_blocks, GROUP * in_groups, seed)
    x = torch.randn(2, rows, GROUP * in_groups, generator=torch.Generator().manual_seed(seed))
    got = Int4Linear(blocks)(x)
    # What the kernel is documented to compute: bfloat16 inputs, bfloat16 (scale, zero) pairs
    # with zero = m + 8 d, products summed in float32, the result rounded to bfloat16.
    scale = blocks.d.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    zero = (blocks.m + 8 * blocks.d).to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    weight = (blocks.q.float() - 8) * scale + zero
    expected = x.to(torch.bfloat16).float() @ weight.T
    assert got.dtype == torch.float32 and got.shape == (2, rows, 16 * out_blocks)
    magnitude = x.to(torch.bfloat16).float().abs() @ weight.abs().T
    # One bfloat16 rounding of the output (2^-9 relative) plus float32 summation-order error.
    assert ((got - expected).abs() <= 2**-8 * expected.abs() + 1e-5 * magnitude).all()


@needs_int4
def test_many_rows_are_multiplied_by_the_exact_dequantised_weight() -> None:
    blocks = random_blocks(48, 96, seed=3)
    layer = Int4Linear(blocks)
    assert torch.equal(layer.plain_weight(), blocks.dequantised())  # the nibbles unpack right
    x = torch.randn(Int4Linear.MANY_ROWS + 3, 96)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, blocks.dequantised()))
    # Below the threshold the bfloat16 kernel runs instead: close, not equal.
    few = x[:5]
    assert not torch.equal(layer(few), few @ blocks.dequantised().T)


@settings(max_examples=25, deadline=None)
@given(out_features=st.integers(1, 8), groups=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_quantise_stays_within_half_a_step_of_every_weight(
    out_features: int, groups: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, groups * GROUP, generator=generator)
    weight[0, :GROUP] = 0.25  # a constant block: zero range, every weight exactly m
    blocks = Q4_1.quantise(weight)
    assert blocks.q.min() >= 0 and blocks.q.max() <= 15
    step = blocks.d.repeat_interleave(GROUP, 1)
    # Half a step, plus float16 storage of d and m (2^-11 relative each, d counted 15 times).
    slack = 2**-10 * (blocks.m.abs() + 15 * blocks.d).repeat_interleave(GROUP, 1)
    assert ((blocks.dequantised() - weight).abs() <= step / 2 + slack + 1e-7).all()
    assert torch.equal(blocks.dequantised()[0, :GROUP], weight[0, :GROUP])


def test_gguf_blocks_read_back_as_the_gguf_library_dequantises_them(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    weight = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    stored = quantize(weight, GGMLQuantizationType.Q4_1)
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_up.weight", stored, raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(96, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tensors = read_q4_1(path)
    assert list(tensors) == ["blk.0.ffn_up.weight"]  # float tensors are not Q4_1
    expected = dequantize(stored, GGMLQuantizationType.Q4_1)
    assert torch.equal(tensors["blk.0.ffn_up.weight"].dequantised(), torch.from_numpy(expected))


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 9), (9, 3), (4, 2)])
def test_rope_row_order_is_transformers_gguf_row_order(heads: int, kv_heads: int) -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = kv_heads * 64
    stored = np.arange(rows * 3).reshape(rows, 3)
    # transformers' own undoing of llama.cpp's interleave, applied when it loads a GGUF.
    loaded = LlamaTensorProcessor()._reverse_permute_weights(stored, heads, kv_heads)
    assert np.array_equal(stored[rope_row_order(rows, kv_heads).numpy()], loaded)


@needs_int4
def test_q4_1_model_follows_the_float_model(tiny_model_dir: Path) -> None:
    from edgestream.llm.loading import load_language_model

    float_lm = load_language_model(str(tiny_model_dir), "float32")
    lm = load_language_model(str(tiny_model_dir), "q4_1")
    assert all(isinstance(b.feed_forward.w_down, Int4Linear) for b in lm.model.layers)
    assert lm.precision == "q4_1" and float_lm.precision == "float32"
    full = float_lm.model
    tokens = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11]])
    with torch.inference_mode():
        want = full(tokens, full.new_cache(16))
        got = lm.model(tokens, lm.model.new_cache(16))
    # 4-bit weights move the logits a little; wiring mistakes (a row order, a missed scale)
    # would leave them unrelated.
    assert torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1] > 0.95
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75


@needs_int4
def test_quantising_needs_the_plain_model(tiny_model_dir: Path) -> None:
    from edgestream.llm.loading import load_language_model

    packed = load_language_model(str(tiny_model_dir), "float32").model
    if not any(not isinstance(b.attention.wo, torch.nn.Linear) for b in packed.layers):
        pytest.skip("this PyTorch build does not pack weights")
    with pytest.raises(TypeError, match="plain model"):
        use_q4_1_linears(packed)


@needs_int4
@needs_smollm2
def test_smollm2_q4_1_takes_every_block_from_its_gguf() -> None:
    from edgestream.llm.loading import load_language_model, resolve_model

    plain = load_language_model("smollm2", "float32", pack=False).model
    # Every linear of all 30 layers (4 fused ones each) matched the dequantised weight exactly.
    assert use_q4_1_linears(plain, resolve_model("smollm2")) == 30 * 4
