"""Worked cases: what the naive computation does and what the pre-normalizer prevents."""

import math

import pytest
import torch

from edgestream.numerics import (
    layer_norm,
    layer_norm_traced,
    prenormalizer,
    rms_norm,
    rms_norm_traced,
    softmax,
    softmax_traced,
)
from edgestream.numerics.report import reference

HALF_ULP = 2.0**-10  # float16 spacing at 1


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Normwise relative error per row, worst row: max|out - ref| / max|ref|."""
    diff = (out.double() - ref).abs().amax(-1)
    return float((diff / ref.abs().amax(-1)).max())


def near_max_half(rows: int, d: int, seed: int = 0) -> torch.Tensor:
    """(rows, d) float16 with |x| in [32768, 65504] and random signs."""
    gen = torch.Generator().manual_seed(seed)
    mag = 32768 + 32736 * torch.rand(rows, d, generator=gen)
    sign = torch.randint(0, 2, (rows, d), generator=gen) * 2 - 1
    return (mag * sign).half()


def test_naive_layer_norm_overflows_near_float16_max_and_optimal_does_not() -> None:
    x = near_max_half(4, 512)
    naive = layer_norm_traced(x, eps=0.0, prenormalizer="none")
    assert naive.overflow.all()
    assert not naive.output.isfinite().all()  # the mean's sum overflowed: x - inf
    safe = layer_norm_traced(x, eps=0.0, prenormalizer="optimal")
    assert not safe.overflow.any()
    assert rel_err(safe.output, reference("layer_norm", x, 0.0)) <= 3 * HALF_ULP


def test_naive_rms_norm_silently_zeroes_a_massive_activation_row() -> None:
    # Llama-family residual streams carry a few activations in the thousands: 1000^2 > 65504.
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1))
    x[:, 7] = 1000.0
    x = x.half()
    naive = rms_norm_traced(x, eps=1e-6, prenormalizer="none")
    assert naive.overflow.all()
    assert naive.output.isfinite().all() and naive.output.abs().max() == 0  # c / inf = 0
    safe = rms_norm_traced(x, eps=1e-6, prenormalizer="optimal")
    assert not safe.overflow.any()
    assert rel_err(safe.output, reference("rms_norm", x, 1e-6)) <= 3 * HALF_ULP


def test_naive_layer_norm_divides_by_an_underflowed_variance() -> None:
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 64, generator=gen, dtype=torch.float64) * 2.0**-20).half()  # subnormal
    naive = layer_norm_traced(x, eps=0.0, prenormalizer="none")
    assert naive.overflow.all()  # squares round to 0: c / 0
    safe = layer_norm(x, eps=0.0)
    assert rel_err(safe, reference("layer_norm", x, 0.0)) <= 3 * HALF_ULP


def test_accumulator_option_changes_what_overflows() -> None:
    x = torch.full((1, 4096), 8.0, dtype=torch.float16)
    x[:, ::2] = -8.0  # sum of squares 262144: float16 overflows, float32 does not
    assert rms_norm_traced(x, prenormalizer="none").overflow.all()
    wide = rms_norm_traced(x, prenormalizer="none", accumulate_dtype=torch.float32)
    assert not wide.overflow.any()
    assert torch.equal(wide.output, x.sign())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_layer_norm_matches_torch_with_affine(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 96, generator=gen).to(dtype)
    w = (1 + torch.rand(96, generator=gen)).to(dtype)
    b = torch.randn(96, generator=gen).to(dtype)
    want = torch.nn.functional.layer_norm(x.double(), (96,), w.double(), b.double(), 1e-5)
    got = layer_norm(x, w, b)
    assert got.dtype == dtype
    assert rel_err(got, want) <= 6 * torch.finfo(dtype).eps


def test_rms_norm_matches_the_definition_and_leaves_input_alone() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 40, generator=gen).half()
    w = torch.rand(40, generator=gen).half()
    before = x.clone()
    got = rms_norm(x, w)
    xd = x.double()
    want = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.equal(x, before)
    assert got.shape == x.shape and rel_err(got, want) <= 4 * HALF_ULP


def test_prenormalizer_is_a_power_of_two_from_max_abs_deviation() -> None:
    x = torch.tensor([[1000.0, -1000.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float16)
    s = prenormalizer(x)
    assert s.shape == (2, 1) and s.dtype == torch.float64
    mantissa, _ = torch.frexp(s)
    assert (mantissa == 0.5).all()
    # Row 0: B = 64, the power of two below sqrt(65504 / (8 eta)) ~ 90; s = 16 gives 62.5.
    assert s[0].item() == 16.0
    assert prenormalizer(x, kind="none").eq(1).all()
    assert prenormalizer(x.T, dim=0).shape == (1, 2)


def test_softmax_none_overflows_and_optimal_is_exact_to_rounding() -> None:
    x = torch.tensor([[12.0, 0.0, -3.0], [float("-inf")] * 3], dtype=torch.float16)
    assert softmax_traced(x[:1], prenormalizer="none").overflow.all()  # e^12 > 65504
    got = softmax(x)
    assert torch.equal(got[1], torch.zeros(3, dtype=torch.float16))  # fully masked row
    assert rel_err(got[:1], torch.softmax(x[:1].double(), -1)) <= 2 * HALF_ULP


def test_softmax_over_another_dim() -> None:
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(5)).half()
    assert torch.equal(softmax(x, dim=0), softmax(x.T.contiguous()).T)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: layer_norm(x, p=0.5), "p must be a number >= 1 or math.inf, got 0.5"),
        (lambda x: layer_norm(x, prenormalizer="max"), r"one of \['optimal'.*got 'max'"),
        (lambda x: softmax(x, prenormalizer="mad"), r"\['optimal', 'none'\], got 'mad'"),
        (lambda x: rms_norm(x, eps=-1.0), "eps must be a finite number >= 0, got -1.0"),
        (lambda x: layer_norm(x.double()), r"dtype must be one of .* got torch.float64"),
        (lambda x: layer_norm(x, torch.ones(3).half()), r"shape \(8,\) .* got shape \(3,\)"),
        (lambda x: rms_norm(x, torch.ones(8)), "dtype torch.float16, got .* torch.float32"),
        (lambda x: softmax(x, dim=2), r"dim must be in \[-2, 1\], got 2"),
        (
            lambda x: layer_norm(x.bfloat16(), accumulate_dtype=torch.float16),
            "represent every bfloat16 value .* got float16",
        ),
    ],
)
def test_bad_arguments_name_expected_and_actual(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(torch.ones(2, 8, dtype=torch.float16))


def test_p_infinity_and_p_one_use_their_norms() -> None:
    x = torch.tensor([[3.0, -1.0, -1.0, -1.0]], dtype=torch.float16)  # mean 0
    assert rel_err(layer_norm(x, eps=0.0, p=math.inf), x.double() / 3) <= HALF_ULP
    assert rel_err(layer_norm(x, eps=0.0, p=1), x.double() / 1.5) <= HALF_ULP
