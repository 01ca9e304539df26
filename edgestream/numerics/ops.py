"""Pre-normalised layer norm, RMS norm and scaled softmax computed in the input's format.

Each operation runs in emulated IEEE arithmetic of x.dtype (``formats.Arithmetic``): every
elementwise result is rounded to x.dtype and every reduction is a pairwise sum rounded to the
accumulator (x.dtype unless ``accumulate_dtype`` is given). Reductions (p-th powers, their sum,
the root, epsilon) run in the accumulator; centring, division and the affine map in x.dtype.
See docs/prenormalizer.md, sections 4 and 6 (softmax) and 7 (emulation).

The ``*_traced`` variants also return the emulated IEEE overflow flag per row, which is how the
evidence shows what ``prenormalizer="none"`` does: an overflowed variance gives a finite but
wrong output (c / inf = 0), so a finite output alone does not prove no overflow happened.
"""

import math
from typing import NamedTuple

import torch

from edgestream.numerics.formats import Arithmetic, FloatFormat, accumulator_format
from edgestream.numerics.prenormalizer import (
    KINDS,
    check_eps,
    check_kind,
    check_p,
    check_tensor,
    prenormalize,
    slack,
)

SOFTMAX_KINDS: tuple[str, ...] = ("optimal", "none")


class Traced(NamedTuple):
    """An operation's output and its emulated overflow flag."""

    output: torch.Tensor  # same shape and dtype as the input
    overflow: torch.Tensor  # bool, the input's shape without the reduced dim


def _check_affine(t: torch.Tensor | None, name: str, x: torch.Tensor) -> torch.Tensor | None:
    """Validate weight or bias: shape (d,), x.dtype. Returns a float64 carrier or None."""
    if t is None:
        return None
    if t.shape != (x.shape[-1],) or t.dtype != x.dtype:
        raise ValueError(
            f"{name} must have shape ({x.shape[-1]},) and dtype {x.dtype}, "
            f"got shape {tuple(t.shape)} and dtype {t.dtype}"
        )
    return t.to(torch.float64)


def _hypot(a: torch.Tensor, b: torch.Tensor, ar: Arithmetic) -> torch.Tensor:
    """sqrt(a^2 + b^2) in A without forming a^2 (which can overflow for p < 2); a, b >= 0.

    Exactly max(a, b) when min(a, b) == 0, so eps = 0 adds no rounding.
    """
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = ar.a(small / torch.where(big > 0, big, 1.0))  # in [0, 1]
    scaled = ar.a(big * ar.a(torch.sqrt(ar.a(1 + ar.a(ratio * ratio)))))
    return torch.where(small > 0, scaled, big)


def _normalised(
    c: torch.Tensor, ar: Arithmetic, p: float, eps: float, log2_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = d^(1/p) * c / N with N = sqrt(||c||_p^2 + d^(2/p) eps / s^2) (section 4).

    This equals c / sqrt(sigma_p(c)^2 + eps / s^2) but never forms the mean of p-th powers,
    whose 1/d factor would underflow where the sum does not (Remark 4.1 of the doc). ||c||_p,
    N and d^(1/p) c are computed and kept in A (|d^(1/p) c_i| <= d^(1/p) B cannot overflow);
    only the quotient rounds into F, so y underflows or overflows only where the exact output
    is within rounding error (Theorem 3) of doing so (|y_i| <= d^(1/p), Lemma 5; in practice
    e4m3 with p = 1 and d near 448 or above).

    Args:
        c: (..., d) centred, scaled values of F. log2_scale: (..., 1), s = 2^log2_scale.
    Returns:
        y: (..., d) values of F; norm: (..., 1) N, a value of A.
    """
    d, a = c.shape[-1], c.abs()
    root_d = 1.0 if p == math.inf else d ** (1 / p)
    if p == 2:  # the usual sqrt(sum c^2 + d eps / s^2), fewer roundings than the hypot
        eps_sq = ar.a(torch.ldexp(torch.full_like(log2_scale, d * eps), -2 * log2_scale))
        norm = ar.a(torch.sqrt(ar.a(ar.sum(ar.a(a * a)) + eps_sq)))
    else:
        if p == math.inf:
            length = a.amax(-1, keepdim=True)  # exact: a max never rounds
        elif p == 1:
            length = ar.sum(a)
        else:
            length = ar.a(ar.sum(ar.a(a**p)) ** (1 / p))
        eps_root = torch.full_like(log2_scale, root_d * math.sqrt(eps))
        norm = _hypot(length, ar.a(torch.ldexp(eps_root, -log2_scale)), ar)
    # d^(1/p) = m * 2^k, m in [1, 2): m is a rounded constant, 2^k an exact exponent shift, so
    # no constant beyond Omega_A (512 > 448 in float8_e4m3fn for p = 1) is ever formed.
    mantissa, exponent = math.frexp(root_d)
    factor = ar.a(torch.tensor(2 * mantissa, dtype=torch.float64))
    stretched = ar.a(torch.ldexp(ar.a(c * factor), torch.tensor(exponent - 1.0)))
    return ar.f(stretched / norm), norm


def _normalize(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    p: float,
    kind: str,
    center: bool,
    accumulate_dtype: torch.dtype | None,
) -> Traced:
    """Shared body of layer_norm (center=True) and rms_norm (center=False) over the last dim."""
    fmt = check_tensor(x)
    ar = Arithmetic(fmt, accumulator_format(fmt, accumulate_dtype))
    w, b = _check_affine(weight, "weight", x), _check_affine(bias, "bias", x)
    p, eps = check_p(p), check_eps(eps)
    c, log2_scale = prenormalize(x.to(torch.float64), ar, p, check_kind(kind, KINDS), center, eps)
    y, norm = _normalised(c, ar, p, eps, log2_scale)  # (..., d), (..., 1)
    if w is not None:
        y = ar.f(y * w)
    if b is not None:
        y = ar.f(y + b)
    overflow = ~(c.isfinite().all(-1) & norm.isfinite().squeeze(-1) & y.isfinite().all(-1))
    return Traced(fmt.cast(y), overflow)


def layer_norm_traced(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    p: float = 2,
    prenormalizer: str = "optimal",
    *,
    accumulate_dtype: torch.dtype | None = None,
) -> Traced:
    """``layer_norm`` plus the per-row overflow flag (shape x.shape[:-1])."""
    return _normalize(x, weight, bias, eps, p, prenormalizer, True, accumulate_dtype)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    p: float = 2,
    prenormalizer: str = "optimal",
    *,
    accumulate_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """L_p layer norm over the last dim, computed in x.dtype (docs/prenormalizer.md, section 4).

    y = w * (x - mean(x)) / sqrt(sigma_p(x - mean(x))^2 + eps) + b, with sigma_p the power
    mean (mean |c_i|^p)^(1/p) (p = 2: the standard layer norm) or max |c_i| (p = inf).

    Args:
        x: (..., d) tensor of a supported dtype.
        weight, bias: optional (d,) tensors of x.dtype.
        p: norm order, >= 1 or math.inf.
        prenormalizer: "optimal" | "linf" | "mad" | "none"; "none" is the naive computation.
        accumulate_dtype: accumulator format for reductions; None means x.dtype.
    Returns:
        (..., d) tensor of x.dtype.
    """
    return layer_norm_traced(
        x, weight, bias, eps, p, prenormalizer, accumulate_dtype=accumulate_dtype
    ).output


def rms_norm_traced(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    prenormalizer: str = "optimal",
    *,
    accumulate_dtype: torch.dtype | None = None,
) -> Traced:
    """``rms_norm`` plus the per-row overflow flag (shape x.shape[:-1])."""
    return _normalize(x, weight, None, eps, 2.0, prenormalizer, False, accumulate_dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    prenormalizer: str = "optimal",
    *,
    accumulate_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """RMS norm over the last dim, computed in x.dtype: y = w * x / sqrt(mean(x^2) + eps).

    Without centring, "optimal" and "linf" coincide (docs/prenormalizer.md, section 5).

    Args:
        x: (..., d) tensor of a supported dtype.
        weight: optional (d,) tensor of x.dtype.
        prenormalizer: "optimal" | "linf" | "mad" | "none".
        accumulate_dtype: accumulator format for reductions; None means x.dtype.
    Returns:
        (..., d) tensor of x.dtype.
    """
    return rms_norm_traced(x, weight, eps, prenormalizer, accumulate_dtype=accumulate_dtype).output


def softmax_exponent(fmt: FloatFormat, acc: FloatFormat, d: int) -> int:
    """k >= 0, the smallest with d * eta * 2^-k <= Omega_A: the sum of the scaled exponentials
    cannot overflow (docs/prenormalizer.md, Theorem 4)."""
    total, k = d * slack(Arithmetic(fmt, acc), d), 0
    while total * 2.0**-k > acc.max_finite:  # 2^-k scaling is exact in float64
        k += 1
    return k


def softmax_error_bound(
    dtype: torch.dtype, d: int, accumulate_dtype: torch.dtype | None = None
) -> float:
    """Theorem 4: bound on max_i |y^_i - y_i| / max_i |y_i| for the "optimal" softmax.

    T = u_F (4 + 1/e + ln d) + h u_A + (d + 1)(2^k + 1) mu_F / 2 to first order, returned as
    T / (1 - T) (inf once T >= 1).
    """
    fmt = check_tensor(torch.empty(1, dtype=dtype))
    acc = accumulator_format(fmt, accumulate_dtype)
    k = softmax_exponent(fmt, acc, d)
    h = max(d - 1, 0).bit_length()
    rounding = fmt.unit_roundoff * (4 + 1 / math.e + math.log(d)) + h * acc.unit_roundoff
    first_order = rounding + (d + 1) * (2**k + 1) * fmt.smallest_subnormal / 2
    return first_order / (1 - first_order) if first_order < 1 else math.inf


def _softmax_rows(x: torch.Tensor, ar: Arithmetic, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim of a float64 carrier of F values. Returns (y, overflow)."""
    if kind == "none":
        e = ar.f(torch.exp(x))
        masked = torch.zeros_like(x[..., :1], dtype=torch.bool)
    else:
        top = x.amax(-1, keepdim=True)  # (..., 1)
        masked = top == -math.inf  # rows where every entry is -inf: output zeros
        z = ar.f(x - torch.where(masked, 0.0, top))  # <= 0; -inf only where exp is 0 anyway
        k = softmax_exponent(ar.fmt, ar.acc, x.shape[-1])
        e = ar.f(torch.exp(z) * 2.0**-k)  # one rounding: 2^-k is an exponent shift
    total = ar.sum(ar.a(e))  # (..., 1), kept in A: e / total rounds once into F
    y = torch.where(masked, 0.0, ar.f(e / total))
    overflow = ~(total.isfinite().squeeze(-1) & y.isfinite().all(-1))
    return y, overflow


def softmax_traced(
    x: torch.Tensor,
    dim: int = -1,
    *,
    prenormalizer: str = "optimal",
    accumulate_dtype: torch.dtype | None = None,
) -> Traced:
    """``softmax`` plus the per-row overflow flag (x's shape without ``dim``)."""
    fmt = check_tensor(x)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim must be in [{-x.ndim}, {x.ndim - 1}], got {dim}")
    ar = Arithmetic(fmt, accumulator_format(fmt, accumulate_dtype))
    kind = check_kind(prenormalizer, SOFTMAX_KINDS)
    y, overflow = _softmax_rows(x.movedim(dim, -1).to(torch.float64), ar, kind)
    return Traced(fmt.cast(y).movedim(-1, dim), overflow)


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    *,
    prenormalizer: str = "optimal",
    accumulate_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Scaled softmax computed in x.dtype (docs/prenormalizer.md, section 6).

    "optimal": y = e / sum(e) with e = exp(x - max x) * 2^-k, k the smallest shift that keeps
    the sum finite in the accumulator (k = 0 in float16 while d * eta <= 65504); rows whose
    entries are all -inf (fully masked) give zeros. "none": exp(x) / sum(exp(x)), which
    overflows once x > log(Omega_F) (about 11.1 in float16).

    Args:
        x: (..., d, ...) tensor of a supported dtype; -inf entries are allowed (masking).
        dim: the dimension to normalise over.
        accumulate_dtype: accumulator format for the sum; None means x.dtype.
    Returns:
        tensor of x's shape and dtype.
    """
    return softmax_traced(
        x, dim, prenormalizer=prenormalizer, accumulate_dtype=accumulate_dtype
    ).output
