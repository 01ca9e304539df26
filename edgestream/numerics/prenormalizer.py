"""The pre-normalizer s(x): a power of two that makes low-precision normalisation overflow-free.

Everything here implements docs/prenormalizer.md: the slack eta (section 3), the bounds B and
A0 (Theorem 1), the two-stage scaling (section 4), the kinds compared there (section 5) and the
error bound (Theorem 3). Names follow the doc: F is the storage format, A the accumulator.
"""

import math

import torch

from edgestream.numerics.formats import (
    Arithmetic,
    FloatFormat,
    accumulator_format,
    float_format,
)

KINDS: tuple[str, ...] = ("optimal", "linf", "mad", "none")


def check_tensor(x: torch.Tensor) -> FloatFormat:
    """Validate an input tensor (..., d) and return its format."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    fmt = float_format(x.dtype)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have shape (..., d) with d >= 1, got {tuple(x.shape)}")
    return fmt


def check_p(p: float) -> float:
    """Validate the norm order: a real p >= 1 or math.inf."""
    if isinstance(p, bool) or not isinstance(p, int | float) or not p >= 1:
        raise ValueError(f"p must be a number >= 1 or math.inf, got {p!r}")
    return float(p)


def check_kind(kind: str, allowed: tuple[str, ...]) -> str:
    """Validate a pre-normalizer kind against the kinds an operation accepts."""
    if kind not in allowed:
        raise ValueError(f"prenormalizer kind must be one of {list(allowed)}, got {kind!r}")
    return kind


def check_eps(eps: float) -> float:
    """Validate the normalisation epsilon: finite and >= 0."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def slack(ar: Arithmetic, d: int) -> float:
    """eta(d) = (1 + u_F)^3 (1 + u_A)^(h + 2), h = ceil(log2 d): bounds every rounding growth
    between an exact bound and a computed value (docs/prenormalizer.md, section 3)."""
    h = max(d - 1, 0).bit_length()
    return (1 + ar.fmt.unit_roundoff) ** 3 * (1 + ar.acc.unit_roundoff) ** (h + 2)


def _power_of_two_below(value: float) -> float:
    """The largest power of two <= value (value > 0): bounds in F round to themselves."""
    _, exponent = math.frexp(value)  # value = m * 2^exponent, m in [0.5, 1)
    return math.ldexp(1.0, exponent - 1)


def norm_bound(ar: Arithmetic, d: int, p: float) -> float:
    """B: the largest max|c_i| of the scaled, centred vector that cannot overflow (Theorem 1).

    B is the largest power of two <= min((Omega_A / (2 d eta))^(1/p), Omega_F / eta) for
    finite p (half of Omega_A is left for the epsilon term), or <= Omega_F / (2 eta) for p = inf.
    """
    eta = slack(ar, d)
    if p == math.inf:
        return _power_of_two_below(ar.fmt.max_finite / (2 * eta))
    limit = min((ar.acc.max_finite / (2 * d * eta)) ** (1 / p), ar.fmt.max_finite / eta)
    return _power_of_two_below(limit)


def prescale_bound(ar: Arithmetic, d: int, p: float) -> float:
    """A0: the largest max|x_i| of the stage-one scaled input (Theorem 1), the largest power of
    two <= min(Omega_A / (2 d eta^2), B / (2 eta))."""
    eta = slack(ar, d)
    limit = min(ar.acc.max_finite / (2 * d * eta**2), norm_bound(ar, d, p) / (2 * eta))
    return _power_of_two_below(limit)


def smallest_exponent(r: torch.Tensor, bound: float) -> torch.Tensor:
    """The smallest integer j with r * 2^-j <= bound = 2^b; 0 where r == 0.

    Pure exponent arithmetic, as hardware would do it: j = ceil(log2 r) - b, where
    ceil(log2 r) is r's exponent, less one when r is an exact power of two.

    Args:
        r: (..., 1) non-negative float64.
    Returns:
        (..., 1) integer-valued float64.
    """
    mantissa, exponent = torch.frexp(r)  # r = mantissa * 2^exponent, mantissa in [0.5, 1)
    ceil_log2 = exponent.to(torch.float64) - (mantissa == 0.5).to(torch.float64)
    _, b_plus_one = math.frexp(bound)
    return torch.where(r > 0, ceil_log2 - (b_plus_one - 1), 0.0)


def centre(x: torch.Tensor, ar: Arithmetic) -> torch.Tensor:
    """x - mean(x) over the last dim: mean summed in A, both rounded to F. (..., d) -> (..., d)."""
    mean = ar.f(ar.a(ar.sum(ar.a(x)) / x.shape[-1]))
    return ar.f(x - mean)


def _statistic(
    kind: str, x0: torch.Tensor, c0: torch.Tensor, ar: Arithmetic, center: bool
) -> torch.Tensor:
    """A provable upper bound on max|c0| from the kind's cheap statistic (section 5). (..., 1)."""
    eta = slack(ar, x0.shape[-1])
    if kind == "optimal":  # max |x - mean|: the exact quantity the bound B constrains
        return c0.abs().amax(-1, keepdim=True)
    if kind == "linf":  # max |x|, with |x_i - mean| <= 2 eta max|x|
        return x0.abs().amax(-1, keepdim=True) * (2 * eta if center else 1.0)
    # mad: max|c| <= sum|c| = d * MAD; the sum is computed in A, within a factor eta.
    return eta * ar.sum(ar.a(c0.abs()))


def prenormalize(
    x: torch.Tensor, ar: Arithmetic, p: float, kind: str, center: bool, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre (optionally) and scale x by its pre-normalizer, in emulated arithmetic.

    Stage one divides by 2^k0 chosen from max|x| so the mean cannot overflow; stage two rescales
    the centred vector by 2^-j from the kind's statistic (docs/prenormalizer.md, section 4).

    Args:
        x: (..., d) float64 carrier of values of ``ar.fmt``; reduced over the last dim.
        eps: the normalisation epsilon; sqrt(eps) floors the statistic so eps / s^2 <= B^2.
    Returns:
        c: (..., d) float64 carrier of F values, (x - mean(x)) / s (or x / s if not center).
        log2_scale: (..., 1) integer-valued float64, s = 2^log2_scale.
    """
    if kind == "none":
        zero = x.new_zeros((*x.shape[:-1], 1))
        return (centre(x, ar) if center else x), zero
    d = x.shape[-1]
    k0 = smallest_exponent(x.abs().amax(-1, keepdim=True), prescale_bound(ar, d, p))
    x0 = ar.f(torch.ldexp(x, -k0))
    c0 = centre(x0, ar) if center else x0
    floor = torch.ldexp(torch.full_like(k0, math.sqrt(eps)), -k0)
    r = torch.maximum(_statistic(kind, x0, c0, ar, center), floor)
    j = smallest_exponent(r, norm_bound(ar, d, p))
    return ar.f(torch.ldexp(c0, -j)), k0 + j


def prenormalizer(
    x: torch.Tensor,
    p: float = 2,
    kind: str = "optimal",
    dim: int = -1,
    *,
    center: bool = True,
    eps: float = 0.0,
    accumulate_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The pre-normalizer s(x) of docs/prenormalizer.md for normalising x over ``dim``.

    Dividing the centred x by s makes every intermediate of an L_p layer norm (or, with
    center=False, an RMS norm) finite in x.dtype with the given accumulator (Theorem 1);
    "optimal" is the smallest such power of two given max|x - mean| (Theorem 2).

    Args:
        x: (..., d, ...) tensor of a supported dtype, normalised over ``dim``.
        p: the norm order, >= 1 or math.inf.
        kind: "optimal" | "linf" | "mad" | "none" (s = 1).
        center: subtract the mean first (layer norm) or not (RMS norm).
        eps: the normalisation epsilon the scale must accommodate.
        accumulate_dtype: accumulator format; None means x.dtype.
    Returns:
        s: float64 tensor of exact powers of two, x's shape with size 1 at ``dim``. float64
        because s can leave x.dtype's exponent range (e.g. 2^-25 for tiny float16 inputs).

    Example: max|x - mean| = 1000 and B = 64 for float16 at d = 4, so s = 16 (1000 / 16 = 62.5);
    the naive sum of squares, 2 * 10^6, would overflow float16.

    >>> x = torch.tensor([[1000.0, -1000.0, 0.0, 0.0]], dtype=torch.float16)
    >>> prenormalizer(x)
    tensor([[16.]], dtype=torch.float64)
    """
    fmt = check_tensor(x)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim must be in [{-x.ndim}, {x.ndim - 1}], got {dim}")
    ar = Arithmetic(fmt, accumulator_format(fmt, accumulate_dtype))
    rows = x.movedim(dim, -1).to(torch.float64)  # (..., d)
    _, log2_scale = prenormalize(
        rows, ar, check_p(p), check_kind(kind, KINDS), center, check_eps(eps)
    )
    return torch.ldexp(torch.ones_like(log2_scale), log2_scale).movedim(-1, dim)


def error_bound(
    dtype: torch.dtype,
    d: int,
    p: float,
    *,
    kappa: float,
    rho: float,
    center: bool = True,
    accumulate_dtype: torch.dtype | None = None,
) -> float:
    """Theorem 3: bound on max_i |y^_i - y_i| / max_i |y_i| for the "optimal" kind, eps = 0.

    Args:
        d: normalised dimension.
        kappa: mean|x| / sigma_p(x), the conditioning of centring (ignored if not center).
        rho: sigma_p(x) / max|x|, which bounds the stage-one underflow term.
    Returns:
        T / (1 - T), T the first-order bound (the closure covers second-order terms).
    """
    fmt = float_format(dtype)
    ar = Arithmetic(fmt, accumulator_format(fmt, accumulate_dtype))
    p = check_p(p)
    u_f, u_a = fmt.unit_roundoff, ar.acc.unit_roundoff
    h = max(d - 1, 0).bit_length()
    beta = 0.0 if p == math.inf else (h + 1) * u_a / p + u_a
    # Centring adds the rounding of x - mean and the mean's error, scaled by kappa.
    centring = 2 * u_f + 2 * kappa * ((h + 1) * u_a + u_f) if center else 0.0
    rounding = u_f + 2 * u_a + beta + centring
    bound = norm_bound(ar, d, p)
    underflow = 4 * fmt.smallest_subnormal / (rho * prescale_bound(ar, d, p))
    underflow += fmt.smallest_subnormal / 2 + ar.acc.smallest_subnormal / bound
    if p != math.inf:
        underflow += 2 ** (p - 1) * d * ar.acc.smallest_subnormal / (p * bound**p)
    first_order = rounding + underflow
    return first_order / (1 - first_order) if first_order < 1 else math.inf
