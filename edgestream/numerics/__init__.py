"""Low-precision numerics: pre-normalised layer norm, RMS norm and softmax (issue 6).

Theory and proofs: docs/prenormalizer.md. Every operation computes in x.dtype by exact
emulation of IEEE rounding (float16, bfloat16, float8_e4m3fn, float8_e5m2, float32), with an
optional wider accumulator.
"""

from edgestream.numerics.formats import SUPPORTED_DTYPES, FloatFormat, float_format
from edgestream.numerics.ops import (
    SOFTMAX_KINDS,
    Traced,
    layer_norm,
    layer_norm_traced,
    rms_norm,
    rms_norm_traced,
    softmax,
    softmax_error_bound,
    softmax_traced,
)
from edgestream.numerics.prenormalizer import KINDS, error_bound, prenormalizer
from edgestream.numerics.report import (
    activation_report,
    adversarial_suite,
    numerics_report,
    report_table,
)

__all__ = [
    "KINDS",
    "SOFTMAX_KINDS",
    "SUPPORTED_DTYPES",
    "FloatFormat",
    "Traced",
    "activation_report",
    "adversarial_suite",
    "error_bound",
    "float_format",
    "layer_norm",
    "layer_norm_traced",
    "numerics_report",
    "prenormalizer",
    "report_table",
    "rms_norm",
    "rms_norm_traced",
    "softmax",
    "softmax_error_bound",
    "softmax_traced",
]
