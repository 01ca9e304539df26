"""The evidence report: adversarial suite, activation report and the rich table."""

import json

import pytest
import torch
from rich.console import Console

from edgestream.numerics import activation_report, adversarial_suite, numerics_report, report_table


def _record(report: dict, op: str, fmt: str, kind: str) -> dict:
    (found,) = [
        r for r in report["results"] if (r["op"], r["format"], r["kind"]) == (op, fmt, kind)
    ]
    return found


def test_suite_covers_the_issue_families_and_stays_in_range() -> None:
    cases = adversarial_suite(torch.float16, dims=(8, 8192))
    names = {c.family for c in cases}
    assert {"near_max d=8192", "one_hot d=8", "near_subnormal d=8192"} <= names
    for case in cases:
        assert case.x.dtype == torch.float16 and case.x.isfinite().all()
    subnormal = next(c.x for c in cases if c.family.startswith("near_subnormal"))
    assert (subnormal.abs() < 2.0**-14).float().mean() > 0.5


def test_float16_report_separates_naive_from_optimal() -> None:
    report = numerics_report(dtypes=(torch.float16,), dims=(8, 512, 8192), elements=2**12)
    json.dumps(report)  # JSON-ready
    for op in ("layer_norm", "rms_norm", "softmax"):
        naive = _record(report, op, "float16", "none")
        optimal = _record(report, op, "float16", "optimal")
        assert naive["overflow_rate"] > 0.2, op
        assert optimal["overflow_rate"] == 0.0, op
        assert optimal["max_ulps"] <= 4.0, op  # the issue's "a few float16 ulps"
    assert _record(report, "layer_norm", "float16", "mad")["max_ulps"] > 4.0  # log2 d bits lost


def test_activation_report_flags_a_massive_activation() -> None:
    hidden = torch.randn(2, 16, 576, generator=torch.Generator().manual_seed(0))
    hidden[..., 3] = 2000.0  # a Llama-style massive activation
    report = activation_report(
        {"block0.input": hidden, "huge": torch.full((1, 8), 1e6)},
        dtypes=(torch.float16,),
        kinds=("optimal", "none"),
        ops=("rms_norm",),
    )
    records = {(r["source"], r["kind"]): r for r in report["results"]}
    assert records[("block0.input", "none")]["overflow_rate"] == 1.0
    assert records[("block0.input", "optimal")]["overflow_rate"] == 0.0
    assert records[("huge", "optimal")]["input_overflow_rows"] == 1  # 1e6 is not a float16


def test_table_renders_every_record() -> None:
    report = numerics_report(dtypes=(torch.bfloat16,), ops=("softmax",), dims=(8,))
    console = Console(width=200, record=True)
    console.print(report_table(report))
    text = console.export_text()
    assert text.count("bfloat16") >= 2 * len(report["results"])


def test_report_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"got unknown \['layer_norm_p7'\]"):
        numerics_report(ops=("layer_norm_p7",))
    with pytest.raises(ValueError, match="got an empty dict"):
        activation_report({})
