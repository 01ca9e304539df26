"""Evidence for docs/prenormalizer.md: an adversarial suite, per-format/kind statistics against a
float64 reference, the same on captured activations, and a rich table of the result.

Metrics (section 8 of the doc), per (op, format, kind) over rows whose float64 reference is
representable in the format (no entry overflows, the largest is at least the smallest
subnormal):
- overflow_rate: fraction of rows whose emulated computation overflowed (the IEEE overflow flag
  of ``ops.*_traced``: a non-finite intermediate or output; this includes c / 0 after the
  variance underflowed to zero, whose quotient overflows);
- max/median relative error over the non-overflowed rows, normwise per row:
  max_i |y^_i - y_i| / max_i |y_i|, also in ulps of 1 (units of 2^-t).
"""

import math
from dataclasses import dataclass
from types import MappingProxyType

import torch
from rich.table import Table

from edgestream.numerics.formats import FloatFormat, float_format
from edgestream.numerics.ops import (
    SOFTMAX_KINDS,
    Traced,
    layer_norm_traced,
    rms_norm_traced,
    softmax_traced,
)
from edgestream.numerics.prenormalizer import KINDS, check_eps

FAMILIES: tuple[str, ...] = ("gaussian", "near_max", "one_hot", "spike", "near_subnormal")
DIMS: tuple[int, ...] = (8, 64, 512, 4096, 8192)
OPS: tuple[str, ...] = ("layer_norm", "layer_norm_p1", "layer_norm_pinf", "rms_norm", "softmax")
REPORT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
# Norm order and centring of each normalisation op.
_NORM_OPS: MappingProxyType[str, tuple[float, bool]] = MappingProxyType(
    {
        "layer_norm": (2.0, True),
        "layer_norm_p1": (1.0, True),
        "layer_norm_pinf": (math.inf, True),
        "rms_norm": (2.0, False),
    }
)
_DEFAULT_EPS: MappingProxyType[str, float] = MappingProxyType(
    {"rms_norm": 1e-6, "softmax": 0.0}  # others: 1e-5
)


@dataclass(frozen=True)
class Case:
    """One adversarial input: rows of one family and dimension, stored in the format."""

    family: str
    x: torch.Tensor  # (rows, d) of the format's dtype


def _family(name: str, fmt: FloatFormat, rows: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, d) float64 draws of one family, before rounding to ``fmt``."""
    sign = torch.randint(0, 2, (rows, d), generator=gen).to(torch.float64) * 2 - 1
    uniform = torch.rand(rows, d, generator=gen, dtype=torch.float64)
    if name == "gaussian":
        return torch.randn(rows, d, generator=gen, dtype=torch.float64)
    if name == "near_max":  # |x| in [Omega / 2, Omega]
        return sign * (0.5 + 0.5 * uniform) * fmt.max_finite
    spot = torch.randint(0, d, (rows, 1), generator=gen)
    peak = sign[:, :1] * (0.5 + 0.5 * uniform[:, :1]) * fmt.max_finite
    if name == "one_hot":
        return torch.zeros(rows, d, dtype=torch.float64).scatter(1, spot, peak)
    if name == "spike":  # unit noise plus one massive activation of Omega / 4 .. Omega / 2
        noise = torch.randn(rows, d, generator=gen, dtype=torch.float64)
        return noise.scatter(1, spot, peak / 2)
    # near_subnormal: |x| log-uniform from mu to 4 lambda, mostly subnormal.
    low, high = math.log2(fmt.smallest_subnormal), math.log2(4 * fmt.smallest_normal)
    return sign * torch.exp2(low + (high - low) * uniform)


def adversarial_suite(
    dtype: torch.dtype,
    dims: tuple[int, ...] = DIMS,
    families: tuple[str, ...] = FAMILIES,
    elements: int = 2**15,
    seed: int = 0,
) -> list[Case]:
    """Adversarial inputs for one format: every family at every dimension.

    Each case has max(2, min(64, elements // d)) rows, so the cost per case is about constant.
    """
    fmt = float_format(dtype)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"families must be among {list(FAMILIES)}, got {unknown}")
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for d in dims:
        rows = max(2, min(64, elements // d))
        for name in families:
            values = fmt.round(_family(name, fmt, rows, d, gen))
            cases.append(Case(f"{name} d={d}", values.to(dtype)))
    return cases


def reference(op: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The float64 result of ``op`` over the last dim of x (..., d); same shape, float64."""
    x = x.to(torch.float64)
    if op == "softmax":
        return torch.softmax(x, dim=-1)
    p, center = _NORM_OPS[op]
    c = x - x.mean(-1, keepdim=True) if center else x
    top = c.abs().amax(-1, keepdim=True)
    # A power-of-two shift keeps |c|^p far from float64's range whatever the input format.
    shift = torch.where(top > 0, torch.floor(torch.log2(top)), 0.0)
    cs = torch.ldexp(c, -shift)
    a = cs.abs()
    sigma = a.amax(-1, keepdim=True) if p == math.inf else a.pow(p).mean(-1, True).pow(1 / p)
    return cs / torch.sqrt(sigma**2 + torch.ldexp(torch.full_like(shift, eps), -2 * shift))


def _run(
    op: str, x: torch.Tensor, kind: str, eps: float, accumulate_dtype: torch.dtype | None
) -> Traced:
    """Run one op over the last dim of x in the emulated format."""
    if op == "softmax":
        return softmax_traced(x, prenormalizer=kind, accumulate_dtype=accumulate_dtype)
    p, center = _NORM_OPS[op]
    if center:
        return layer_norm_traced(
            x, eps=eps, p=p, prenormalizer=kind, accumulate_dtype=accumulate_dtype
        )
    return rms_norm_traced(x, eps=eps, prenormalizer=kind, accumulate_dtype=accumulate_dtype)


@dataclass(frozen=True)
class _RowStats:
    """Per-row outcome of one op on one case."""

    representable: torch.Tensor  # (rows,) bool: the reference fits the format
    overflow: torch.Tensor  # (rows,) bool
    error: torch.Tensor  # (rows,) float64 normwise relative error (nan where overflowed)


def _row_stats(
    op: str, x: torch.Tensor, kind: str, eps: float, accumulate_dtype: torch.dtype | None
) -> _RowStats:
    """Compare one op on x (rows, d) with the float64 reference."""
    fmt = float_format(x.dtype)
    ref = reference(op, x, eps)
    traced = _run(op, x, kind, eps, accumulate_dtype)
    scale = ref.abs().amax(-1)
    # The format can hold the answer: nothing overflows, not everything rounds to zero (a
    # softmax of width 4096 is below float8_e4m3fn's smallest subnormal). False for NaN rows.
    representable = (ref.abs() < fmt.overflow_threshold).all(-1) & (scale >= fmt.smallest_subnormal)
    diff = (traced.output.to(torch.float64) - ref).abs().amax(-1)
    error = torch.where(scale > 0, diff / scale, diff)
    return _RowStats(representable, traced.overflow, torch.where(traced.overflow, math.nan, error))


def _summarise(labels: list[str], stats: list[_RowStats], fmt: FloatFormat) -> dict:
    """Aggregate per-case row stats into one record's numbers."""
    keep = torch.cat([s.representable for s in stats])
    overflow = torch.cat([s.overflow for s in stats])[keep]
    error = torch.cat([s.error for s in stats])[keep]
    owner = [label for label, s in zip(labels, stats, strict=True) for _ in range(len(s.error))]
    owner = [label for label, k in zip(owner, keep.tolist(), strict=True) if k]
    valid = ~error.isnan()
    rows = int(keep.sum())
    record: dict = {
        "rows": rows,
        "excluded_rows": int((~keep).sum()),
        "overflow_rate": float(overflow.double().mean()) if rows else math.nan,
        "max_rel_err": math.nan,
        "median_rel_err": math.nan,
        "max_ulps": math.nan,
        "median_ulps": math.nan,
        "worst": "",
    }
    if valid.any():
        worst = int(torch.where(valid, error, -1.0).argmax())
        record["max_rel_err"] = float(error[worst])
        record["median_rel_err"] = float(error[valid].median())
        record["max_ulps"] = record["max_rel_err"] / fmt.epsilon
        record["median_ulps"] = record["median_rel_err"] / fmt.epsilon
        record["worst"] = owner[worst]
    return record


def _records(
    source: str,
    cases: dict[torch.dtype, list[Case]],
    kinds: tuple[str, ...],
    ops: tuple[str, ...],
    eps: float | None,
    accumulate_dtype: torch.dtype | None,
) -> list[dict]:
    """One record per (op, format, kind); softmax only takes its own kinds."""
    unknown = sorted(set(ops) - set(OPS)) + sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(
            f"ops must be among {list(OPS)} and kinds among {list(KINDS)}, got unknown {unknown}"
        )
    records = []
    for dtype, format_cases in cases.items():
        fmt = float_format(dtype)
        acc = fmt.name if accumulate_dtype is None else float_format(accumulate_dtype).name
        for op in ops:
            op_eps = check_eps(_DEFAULT_EPS.get(op, 1e-5) if eps is None else eps)
            for kind in kinds:
                if op == "softmax" and kind not in SOFTMAX_KINDS:
                    continue
                stats = [_row_stats(op, c.x, kind, op_eps, accumulate_dtype) for c in format_cases]
                labels = [c.family for c in format_cases]
                head = {"source": source, "op": op, "format": fmt.name, "accumulator": acc}
                records.append(head | {"kind": kind} | _summarise(labels, stats, fmt))
    return records


def numerics_report(
    dtypes: tuple[torch.dtype, ...] = REPORT_DTYPES,
    kinds: tuple[str, ...] = KINDS,
    ops: tuple[str, ...] = OPS,
    dims: tuple[int, ...] = DIMS,
    eps: float | None = 0.0,
    accumulate_dtype: torch.dtype | None = None,
    elements: int = 2**15,
    seed: int = 0,
) -> dict:
    """Run the adversarial suite for every format, op and kind.

    Args:
        eps: normalisation epsilon; 0.0 (the default) is the worst case, where nothing hides
            an underflowed variance; None uses each op's default (1e-5, RMS 1e-6).
        accumulate_dtype: accumulator for every format; None means each format's own.
    Returns:
        JSON-ready dict: {"eps", "accumulate_dtype", "dims", "families", "seed",
        "results": [record, ...]}, each record {"source", "op", "format", "accumulator",
        "kind", "rows", "excluded_rows", "overflow_rate", "max_rel_err", "median_rel_err",
        "max_ulps", "median_ulps", "worst"}.
    """
    cases = {dtype: adversarial_suite(dtype, dims, FAMILIES, elements, seed) for dtype in dtypes}
    results = _records("adversarial", cases, kinds, ops, eps, accumulate_dtype)
    return {
        "eps": eps,
        "accumulate_dtype": None if accumulate_dtype is None else str(accumulate_dtype),
        "dims": list(dims),
        "families": list(FAMILIES),
        "seed": seed,
        "results": results,
    }


def activation_report(
    tensors: dict[str, torch.Tensor],
    dtypes: tuple[torch.dtype, ...] = REPORT_DTYPES,
    kinds: tuple[str, ...] = KINDS,
    ops: tuple[str, ...] = ("layer_norm", "rms_norm"),
    eps: float | None = None,
    accumulate_dtype: torch.dtype | None = None,
    max_rows: int = 4096,
) -> dict:
    """The report's statistics on captured activations (e.g. the inputs of a model's norms).

    Each tensor (..., d) of any float dtype is flattened to rows, evenly subsampled to at most
    ``max_rows``, and rounded to each format; rows with values beyond the format's range are
    counted in "input_overflow_rows" and dropped, since no normalisation can fix its input.

    Returns:
        {"eps", "accumulate_dtype", "results": [record, ...]} with the records of
        ``numerics_report`` plus "input_overflow_rows"; "source" is the tensor's name.
    """
    if not tensors:
        raise ValueError("tensors must name at least one activation tensor, got an empty dict")
    results = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor) or tensor.ndim == 0 or tensor.numel() == 0:
            raise ValueError(
                f"tensors[{name!r}] must be a non-empty tensor (..., d), got {tensor!r}"
            )
        rows = tensor.detach().reshape(-1, tensor.shape[-1]).to(torch.float64)  # (N, d)
        rows = rows[torch.linspace(0, len(rows) - 1, min(max_rows, len(rows))).long()]
        for dtype in dtypes:
            values = float_format(dtype).round(rows)
            fits = values.isfinite().all(-1)
            cases = {dtype: [Case(name, values[fits].to(dtype))]}
            for record in _records(name, cases, kinds, ops, eps, accumulate_dtype):
                results.append(record | {"input_overflow_rows": int((~fits).sum())})
    return {
        "eps": eps,
        "accumulate_dtype": None if accumulate_dtype is None else str(accumulate_dtype),
        "results": results,
    }


def _number(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def report_table(report: dict) -> Table:
    """Render a ``numerics_report`` or ``activation_report`` result as a rich Table."""
    title = f"edgestream numerics (eps={report['eps']}, accumulator={report['accumulate_dtype']})"
    table = Table(title=title)
    for column in (
        "source",
        "op",
        "format",
        "acc",
        "kind",
        "rows",
        "overflow",
        "max rel err",
        "max ulps",
        "median ulps",
        "worst case",
    ):
        table.add_column(column, justify="left" if column in ("source", "worst case") else "right")
    for r in report["results"]:
        table.add_row(
            r["source"],
            r["op"],
            r["format"],
            r["accumulator"],
            r["kind"],
            str(r["rows"]),
            _number(100 * r["overflow_rate"], ".1f") + "%",
            _number(r["max_rel_err"], ".2e"),
            _number(r["max_ulps"], ".2f"),
            _number(r["median_ulps"], ".2f"),
            r["worst"],
        )
    return table
