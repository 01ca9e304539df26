"""Hypothesis properties: Theorems 1, 3 and 4 of docs/prenormalizer.md against float64.

Hypothesis draws the structure of an input (format, accumulator, family, width, magnitude,
seed) rather than every element, so examples are cheap and shrink to readable cases.
"""

import math

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edgestream.numerics import (
    error_bound,
    float_format,
    layer_norm_traced,
    rms_norm_traced,
    softmax_error_bound,
    softmax_traced,
)
from edgestream.numerics.report import reference

FAST = settings(max_examples=60, deadline=None)
FAMILIES = ("gaussian", "spike", "one_hot", "offset", "wide")
# (dtype, accumulate_dtype, largest d): float8 with its own accumulator is only viable for
# small d (docs/prenormalizer.md, section 8), so wider rows get a float16/float32 accumulator.
CONFIGS = (
    (torch.float16, None, 1024),
    (torch.float16, torch.float32, 1024),
    (torch.bfloat16, None, 1024),
    (torch.float32, None, 1024),
    (torch.float8_e4m3fn, None, 16),
    (torch.float8_e4m3fn, torch.float16, 1024),
    (torch.float8_e5m2, None, 64),
    (torch.float8_e5m2, torch.float32, 1024),
)


@st.composite
def inputs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.dtype | None]:
    """(2, d) tensor of a format's values and the accumulator to use."""
    dtype, acc, d_max = draw(st.sampled_from(CONFIGS))
    fmt = float_format(dtype)
    d = draw(st.integers(2, d_max))
    family = draw(st.sampled_from(FAMILIES))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(2, d, generator=gen, dtype=torch.float64)
    if family == "spike":
        x[:, draw(st.integers(0, d - 1))] = draw(st.floats(-1e6, 1e6))
    elif family == "one_hot":
        x = torch.zeros_like(x)
        x[:, draw(st.integers(0, d - 1))] = 1.0
    elif family == "offset":  # mean dominates the spread: kappa up to ~2^(t - 2)
        x = x + 2.0 ** draw(st.integers(0, fmt.mantissa_bits - 2))
    elif family == "wide":  # magnitudes spread over 2^16
        x = x * torch.exp2(16 * torch.rand(2, d, generator=gen, dtype=torch.float64))
    # Place the largest magnitude anywhere from near the subnormals up to Omega.
    top = math.log2(fmt.max_finite)
    low = math.log2(fmt.smallest_subnormal) + fmt.mantissa_bits + 4
    scale = 2.0 ** draw(st.integers(math.ceil(low), math.floor(top) - 1))
    x = x / x.abs().amax(-1, keepdim=True) * scale
    return fmt.round(x).to(dtype), acc


def _row_error(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (out.double() - ref).abs().amax(-1) / ref.abs().amax(-1)


def _representable(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmt = float_format(dtype)
    return (ref.abs() < fmt.overflow_threshold).all(-1) & ref.isfinite().all(-1)


def _one_hot(d: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.zeros(2, d)
    x[:, 0] = 1.0
    return x.to(dtype)


@FAST
@given(inputs(), st.sampled_from([1.0, 1.5, 2.0, 3.0, math.inf]))
@example((_one_hot(896, torch.float8_e4m3fn), torch.float16), 1.0)  # found by hypothesis
def test_optimal_layer_norm_never_overflows_and_meets_theorem_3(case, p: float) -> None:
    x, acc = case
    traced = layer_norm_traced(x, eps=0.0, p=p, accumulate_dtype=acc)
    ref = reference({1.0: "layer_norm_p1", math.inf: "layer_norm_pinf"}.get(p, "layer_norm"), x, 0)
    if p not in (1.0, 2.0, math.inf):  # reference() only names three orders; compute this one
        c = x.double() - x.double().mean(-1, keepdim=True)
        cs = c / c.abs().amax(-1, keepdim=True)
        ref = cs / cs.abs().pow(p).mean(-1, keepdim=True).pow(1 / p)
    xd = x.double()
    c = xd - xd.mean(-1, keepdim=True)
    sigma = c.abs().amax(-1) if p == math.inf else c.abs().pow(p).mean(-1).pow(1 / p)
    kappa = xd.abs().mean(-1) / sigma
    rho = sigma / xd.abs().amax(-1)
    errors = _row_error(traced.output, ref)
    representable = _representable(ref, x.dtype)
    for row in representable.nonzero().flatten().tolist():
        bound = error_bound(
            x.dtype,
            x.shape[-1],
            p,
            kappa=float(kappa[row]),
            rho=float(rho[row]),
            accumulate_dtype=acc,
        )
        # Theorem 1: no overflow unless the exact output lies within Theorem 3's error of the
        # threshold (a one-hot e4m3 row of d = 896, p = 1, is exactly 448 = Omega and
        # computes 478: its centred values round to 3 mantissa bits).
        peak = float(ref[row].abs().max()) * (1 + bound)
        if peak < float_format(x.dtype).overflow_threshold:
            assert not traced.overflow[row], (row, peak)
        if not traced.overflow[row]:
            assert errors[row] <= bound, (row, float(errors[row]), bound)


@FAST
@given(inputs(), st.sampled_from(["optimal", "linf"]))
def test_rms_norm_never_overflows_and_meets_theorem_3(case, kind: str) -> None:
    x, acc = case
    traced = rms_norm_traced(x, eps=0.0, prenormalizer=kind, accumulate_dtype=acc)
    ref = reference("rms_norm", x, 0.0)
    keep = _representable(ref, x.dtype)
    assert not traced.overflow[keep].any()
    xd = x.double()
    rho = xd.pow(2).mean(-1).sqrt() / xd.abs().amax(-1)
    errors = _row_error(traced.output, ref)
    for row in keep.nonzero().flatten().tolist():
        bound = error_bound(
            x.dtype, x.shape[-1], 2, kappa=0.0, rho=float(rho[row]), center=False,
            accumulate_dtype=acc,
        )  # fmt: skip
        assert errors[row] <= bound, (row, float(errors[row]), bound)


@FAST
@given(inputs())
def test_no_kind_lets_the_sums_overflow_in_float16(case) -> None:
    """Theorem 1 for every kind: the overflow flag stays down where nothing underflows."""
    x, acc = case
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.shape[-1] > 256:
        return
    for kind in ("optimal", "linf", "mad"):
        traced = layer_norm_traced(x, eps=1e-5, prenormalizer=kind, accumulate_dtype=acc)
        assert not traced.overflow.any(), kind


@FAST
@given(inputs(), st.integers(-3, 3))
def test_optimal_output_is_invariant_to_exact_power_of_two_scaling(case, shift: int) -> None:
    """Lemma 2: scaling by 2^k is exact, and s(x) absorbs it, so outputs are bitwise equal."""
    x, acc = case
    fmt = float_format(x.dtype)
    scaled = torch.ldexp(x.double(), torch.tensor(float(shift)))
    normal = x.double().abs().min(-1).values >= fmt.smallest_normal * 8
    if not normal.all() or scaled.abs().max() >= fmt.max_finite:
        return
    a = layer_norm_traced(x, eps=0.0, accumulate_dtype=acc).output
    b = layer_norm_traced(scaled.to(x.dtype), eps=0.0, accumulate_dtype=acc).output
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@FAST
@given(inputs(), st.floats(0.0, 1.0))
def test_optimal_softmax_never_overflows_and_meets_theorem_4(case, masked: float) -> None:
    x, acc = case
    # Logits anywhere up to Omega: shift so a fraction of rows' entries are far below the max.
    x = x.clone()
    x[:, : int(masked * x.shape[-1])] = -float_format(x.dtype).max_finite
    traced = softmax_traced(x, accumulate_dtype=acc)
    assert not traced.overflow.any()
    ref = torch.softmax(x.double(), -1)
    keep = ref.abs().amax(-1) >= float_format(x.dtype).smallest_subnormal
    bound = softmax_error_bound(x.dtype, x.shape[-1], acc)
    assert (_row_error(traced.output, ref)[keep] <= bound).all()
