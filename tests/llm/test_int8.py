"""Int8 drafting layers and the choice of drafting precision."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgestream.llm import methods
from edgestream.llm.int8 import Int8Linear, int8_available
from edgestream.llm.methods import draft_dtype_name, drafting_dtype

needs_int8 = pytest.mark.skipif(
    not int8_available(), reason="this PyTorch build has no int8 engine"
)


@needs_int8
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    out_features=st.integers(1, 40),
    in_features=st.integers(1, 40),
    row_scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_int8_linear_is_the_float_product_up_to_int8_rounding(
    rows: int, out_features: int, in_features: int, row_scale: float, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different sizes: one scale per output row keeps each row's relative error.
    weight = torch.randn(out_features, in_features, generator=generator)
    weight *= torch.logspace(0, 3, out_features)[:, None] * row_scale
    x = torch.randn(2, rows, in_features, generator=generator)
    got = Int8Linear(weight)(x.to(torch.bfloat16))
    expected = x.to(torch.bfloat16).float() @ weight.T
    assert got.dtype == torch.float32 and got.shape == (2, rows, out_features)
    # Weight rounding (half a step of max|w|/127 per element) plus the input's (one scale
    # for every row: half a step of max|x|/127, or /63 on AVX2 kernels that keep 7 bits).
    bound = (
        weight.abs().amax(1) / 254 * x.abs().sum(-1, keepdim=True)
        + x.abs().amax() / 126 * weight.abs().sum(1)
    ) * 1.01 + 1e-5
    assert ((got - expected).abs() <= bound).all()


def test_drafting_dtype_names_and_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert drafting_dtype("float32", torch.float32) == torch.float32
    assert drafting_dtype("bfloat16", torch.float32) == torch.bfloat16
    assert draft_dtype_name(torch.qint8) == "int8"
    assert draft_dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="unknown draft dtype 'int4'"):
        drafting_dtype("int4", torch.float32)
    monkeypatch.setattr(methods, "native_bfloat16", lambda: True)
    assert drafting_dtype("auto", torch.float32) == torch.bfloat16
    assert drafting_dtype("auto", torch.bfloat16) == torch.bfloat16  # the model's own
    monkeypatch.setattr(methods, "native_bfloat16", lambda: False)
    monkeypatch.setattr(methods, "int8_measured", lambda: True)
    assert drafting_dtype("auto", torch.float32) == torch.qint8
    monkeypatch.setattr(methods, "int8_measured", lambda: False)
    assert drafting_dtype("auto", torch.float32) == torch.float32
    monkeypatch.setattr(methods, "int8_available", lambda: False)
    with pytest.raises(ValueError, match="no quantised int8 engine"):
        drafting_dtype("int8", torch.float32)
