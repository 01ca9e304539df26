"""Floating-point formats: their parameters, and exact emulation of arithmetic in them.

The parameters (Omega, lambda, mu, t, u) are the ones the theory in ``docs/prenormalizer.md``
(section 1) is stated in. ``Arithmetic`` computes "in a format" the way IEEE 754 defines it:
every elementary result is rounded to nearest-even into the format, overflow gives +-inf.
Values are carried in float64 tensors that hold exactly representable values of the format,
because (a) PyTorch has no CPU arithmetic for float8, and (b) PyTorch's CPU reductions on
float16/bfloat16 accumulate in float32, which would hide the overflows we want to study
(docs/prenormalizer.md, section 7).
"""

import math
from dataclasses import dataclass

import torch

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float32,
)

# Formats whose encodings have no infinity: overflow produces NaN (OCP FP8 "fn" semantics).
_FINITE_ONLY: tuple[torch.dtype, ...] = (torch.float8_e4m3fn,)


@dataclass(frozen=True)
class FloatFormat:
    """Parameters of a binary floating-point format (docs/prenormalizer.md, section 1)."""

    name: str
    dtype: torch.dtype
    max_finite: float  # Omega: largest finite value
    smallest_normal: float  # lambda = 2^e_min
    smallest_subnormal: float  # mu = 2^(e_min - t)
    mantissa_bits: int  # t: explicit fraction bits (precision t + 1)
    has_inf: bool  # False for float8_e4m3fn, whose overflow is NaN

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-(t+1): the relative error bound of one rounding in the normal range."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def epsilon(self) -> float:
        """2^-t: the spacing of the format at 1 (one ulp of 1); errors are reported in it."""
        return 2.0**-self.mantissa_bits

    @property
    def overflow_threshold(self) -> float:
        """Smallest magnitude that rounds to overflow: Omega + ulp(Omega) / 2."""
        top_exponent = math.floor(math.log2(self.max_finite))
        return self.max_finite + 2.0 ** (top_exponent - self.mantissa_bits - 1)

    def contains(self, other: "FloatFormat") -> bool:
        """True if every finite value of ``other`` is a finite value of this format."""
        return (
            self.max_finite >= other.max_finite
            and self.smallest_subnormal <= other.smallest_subnormal
            and self.mantissa_bits >= other.mantissa_bits
        )

    def round(self, v: torch.Tensor) -> torch.Tensor:
        """Round a float64 tensor to nearest-even in this format; overflow gives +-inf.

        Args:
            v: float64 tensor, any shape.
        Returns:
            float64 tensor of the same shape holding values of this format (or +-inf / NaN).
        """
        rounded = v.to(self.dtype).to(torch.float64)
        # PyTorch saturates float8_e4m3fn casts to 448; IEEE semantics overflow instead.
        overflow = v.abs() >= self.overflow_threshold
        return torch.where(overflow, v.sign() * math.inf, rounded)

    def cast(self, v: torch.Tensor) -> torch.Tensor:
        """Store a float64 tensor of this format's values in ``self.dtype``.

        Infinities become NaN for formats without an infinity, where PyTorch would saturate.
        """
        if not self.has_inf:
            v = torch.where(v.isinf(), math.nan, v)
        return v.to(self.dtype)


def float_format(dtype: torch.dtype) -> FloatFormat:
    """The ``FloatFormat`` of a supported dtype, from ``torch.finfo``.

    Raises:
        ValueError: for a dtype outside ``SUPPORTED_DTYPES``.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {list(SUPPORTED_DTYPES)}, got {dtype}")
    info = torch.finfo(dtype)
    mantissa_bits = round(-math.log2(info.eps))
    return FloatFormat(
        name=str(dtype).removeprefix("torch."),
        dtype=dtype,
        max_finite=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_normal) * float(info.eps),
        mantissa_bits=mantissa_bits,
        has_inf=dtype not in _FINITE_ONLY,
    )


def accumulator_format(fmt: FloatFormat, accumulate_dtype: torch.dtype | None) -> FloatFormat:
    """The accumulator format: ``fmt`` itself when None, else one that contains ``fmt``.

    Raises:
        ValueError: if the accumulator cannot represent every value of ``fmt``.
    """
    if accumulate_dtype is None:
        return fmt
    acc = float_format(accumulate_dtype)
    if not acc.contains(fmt):
        raise ValueError(
            f"accumulate_dtype must represent every {fmt.name} value (wider exponent range "
            f"and mantissa), got {acc.name}"
        )
    return acc


@dataclass(frozen=True)
class Arithmetic:
    """Elementwise operations rounded to ``fmt``; reductions rounded to ``acc``.

    All tensors are float64 carriers of exactly representable values.
    """

    fmt: FloatFormat  # F: storage and elementwise format
    acc: FloatFormat  # A: accumulator format, contains F

    def f(self, v: torch.Tensor) -> torch.Tensor:
        """Round an exact elementwise result to F."""
        return self.fmt.round(v)

    def a(self, v: torch.Tensor) -> torch.Tensor:
        """Round an exact reduction-side result to A."""
        return self.acc.round(v)

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        """Pairwise (binary tree) sum over the last dim, each partial sum rounded to A.

        A tree of height ceil(log2 d) is what vector units and GPU reductions do, and gives the
        gamma_{ceil(log2 d)} error bound of docs/prenormalizer.md, Lemma 3. Zero padding to a
        power of two adds nothing (x + 0 is exact).

        Args:
            v: (..., d) values of A.
        Returns:
            (..., 1) the sum.
        """
        d = v.shape[-1]
        width = 1 << max(d - 1, 0).bit_length()
        v = torch.nn.functional.pad(v, (0, width - d))
        while v.shape[-1] > 1:
            half = v.shape[-1] // 2
            v = self.a(v[..., :half] + v[..., half:])  # (..., width / 2^level)
        return v
