"""Format parameters and the emulated arithmetic the numerics are built on."""

import math

import pytest
import torch

from edgestream.numerics.formats import Arithmetic, accumulator_format, float_format

# dtype: (Omega, lambda, mu, t) from the IEEE 754 / OCP FP8 specifications.
KNOWN = {
    torch.float16: (65504.0, 2.0**-14, 2.0**-24, 10),
    torch.bfloat16: ((2 - 2.0**-7) * 2.0**127, 2.0**-126, 2.0**-133, 7),
    torch.float8_e4m3fn: (448.0, 2.0**-6, 2.0**-9, 3),
    torch.float8_e5m2: (57344.0, 2.0**-14, 2.0**-16, 2),
    torch.float32: ((2 - 2.0**-23) * 2.0**127, 2.0**-126, 2.0**-149, 23),
}


@pytest.mark.parametrize("dtype", list(KNOWN))
def test_parameters_match_the_specifications(dtype: torch.dtype) -> None:
    fmt = float_format(dtype)
    got = (fmt.max_finite, fmt.smallest_normal, fmt.smallest_subnormal, fmt.mantissa_bits)
    assert got == KNOWN[dtype]
    assert fmt.unit_roundoff == 2.0 ** -(fmt.mantissa_bits + 1)


def test_rounding_is_nearest_even_with_ieee_overflow() -> None:
    half = float_format(torch.float16)
    v = torch.tensor([65519.0, 65520.0, -1e6, 2.0**-25, 3 * 2.0**-25, 1 + 2.0**-11])
    got = half.round(v.double())
    assert got.tolist() == [65504.0, math.inf, -math.inf, 0.0, 2.0**-23, 1.0]


def test_e4m3fn_overflows_instead_of_saturating() -> None:
    # PyTorch saturates float8_e4m3fn casts to 448; the emulation must not hide overflow.
    e4m3 = float_format(torch.float8_e4m3fn)
    got = e4m3.round(torch.tensor([463.0, 464.0, 1e6], dtype=torch.float64))
    assert got.tolist() == [448.0, math.inf, math.inf]
    assert e4m3.cast(got).to(torch.float32)[1:].isnan().all()


def test_pairwise_sum_rounds_in_the_accumulator() -> None:
    half = float_format(torch.float16)
    squares = torch.full((1, 4096), 64.0, dtype=torch.float64)  # sum 262144 > 65504
    assert Arithmetic(half, half).sum(squares).item() == math.inf
    wide = accumulator_format(half, torch.float32)
    assert Arithmetic(half, wide).sum(squares).item() == 262144.0
    # PyTorch's own float16 CPU mean accumulates in float32 and hides that overflow.
    assert torch.isfinite(squares.half().mean())


def test_pairwise_sum_of_non_power_of_two_width() -> None:
    half = float_format(torch.float16)
    v = torch.arange(1.0, 8.0, dtype=torch.float64).reshape(1, 7)
    assert Arithmetic(half, half).sum(v).tolist() == [[28.0]]


def test_bad_formats_raise_value_error() -> None:
    with pytest.raises(ValueError, match=r"dtype must be one of .* got torch.float64"):
        float_format(torch.float64)
    with pytest.raises(ValueError, match="accumulate_dtype must represent every bfloat16"):
        accumulator_format(float_format(torch.bfloat16), torch.float16)
