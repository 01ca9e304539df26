"""docs/results.md's measured tables, rendered from the benchmarks' JSON reports.

The page keeps its prose by hand; each generated table sits between `<!-- begin NAME -->` and
`<!-- end NAME -->` markers and is replaced wholesale, so re-running the benchmarks and then
`edgestream bench results` brings every number on the page up to date at once.
"""

from __future__ import annotations

import re
from pathlib import Path


def _machine(setup: dict) -> str:
    parts = [
        f"{setup.get('cpu', '?')}, {setup.get('threads', '?')} threads",
        f"Python {setup.get('python', '?')}",
        f"torch {setup.get('torch', '?')}",
        f"transformers {setup.get('transformers', '?')}",
        f"edgestream {setup.get('edgestream', '?')}",
    ]
    return "; ".join(parts)


def _count(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.0f} k" if n >= 10_000 else f"{n:,}"


def _mib(value: object) -> str:
    return f"{value:,.0f} MiB" if isinstance(value, (int, float)) else "-"


def _minutes(seconds: object) -> str:
    return f"{seconds / 60:.0f} min" if isinstance(seconds, (int, float)) else "-"


def render_spec(report: dict) -> str:
    """Methods overall (speed, acceptance, exactness, size, training) and per category."""
    setup, methods = report["setup"], report["methods"]
    lines = [
        f"{setup.get('prompts', '?')} prompts, <= {report['max_new_tokens']} new tokens, "
        f"{setup.get('dtype', '?')}, {setup.get('decoding', 'greedy')}; {_machine(setup)}; "
        f"peak memory of the process with every method loaded: "
        f"{_mib(setup.get('peak_memory_mib'))}.",
        "",
        "| method | tok/s | speedup vs ar | accepted tokens / pass | exact match vs ar "
        "| extra parameters | training | peak memory, alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, result in methods.items():
        o = result["overall"]
        params = _count(result.get("extra_parameters"))
        if "full_vocab_parameters" in result:
            params += f" ({_count(result['full_vocab_parameters'])} with full-vocabulary heads)"
        lines.append(
            f"| {name} | {o['tokens_per_second']:.1f} | {o['speedup']:.2f}x | "
            f"{o['mean_accepted']:.2f} | {o['exact_match_vs_ar']:.2f} | {params} | "
            f"{_minutes(result.get('train_seconds'))} | {_mib(result.get('peak_memory_mib'))} |"
        )
    categories = sorted(next(iter(methods.values()))["categories"])
    others = [n for n in methods if n != "ar"]
    lines += [
        "",
        "Speedup / accepted tokens per pass, per category:",
        "",
        "| category | " + " | ".join(others) + " |",
        "|---|" + "---|" * len(others),
    ]
    for category in categories:
        cells = []
        for name in others:
            st = methods[name]["categories"].get(category)
            cells.append(f"{st['speedup']:.2f}x / {st['mean_accepted']:.2f}" if st else "-")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_quality(report: dict) -> str:
    """Variants (base, LoRA, shared) with the task metric and SS speed where measured."""
    rows = report["variants"]
    metrics = [k for k in ("rouge1", "rougeLsum", "exact_match", "accuracy") if k in rows[0]]
    lines = [
        f"{report['task']}: {report['prompts']} held-back test prompts, greedy, <= "
        f"{report['max_new_tokens']} new tokens, {report['setup'].get('dtype', '?')}; "
        f"{_machine(report['setup'])}.",
        "",
        "| variant | mode | training | "
        + " | ".join(metrics)
        + f" | {metrics[0]} vs row above (95% CI) | AR tok/s | SS speedup | accepted / pass"
        " | SS exact vs AR |",
        "|---|---|---|" + "---|" * len(metrics) + "---|---|---|---|---|",
    ]
    for row in rows:
        steps = row.get("train_steps")
        training = "-" if steps is None else f"{steps} steps, {_minutes(row.get('train_seconds'))}"
        speed = (
            [
                f"{row['ar_tokens_per_second']:.1f}",
                f"{row['speedup']:.2f}x",
                f"{row['mean_accepted']:.2f}",
                f"{row['exact_match_vs_ar']:.2f}",
            ]
            if "speedup" in row
            else ["-"] * 4
        )
        lines.append(
            f"| {row['variant']} | {row['mode']} | {training} | "
            + " | ".join(f"{row[m]:.2f}" for m in metrics)
            + f" | {format_difference(row.get('vs_previous', {}).get(metrics[0]))} | "
            + " | ".join(speed)
            + " |"
        )
    return "\n".join(lines)


def format_difference(paired: dict[str, float] | None) -> str:
    """'-0.86 [-3.10, +1.40]' from `paired_difference`'s result; '-' when there is none.

    >>> format_difference({"difference": -0.86, "low": -3.1, "high": 1.4})
    '-0.86 [-3.10, +1.40]'
    """
    if paired is None:
        return "-"
    return f"{paired['difference']:+.2f} [{paired['low']:+.2f}, {paired['high']:+.2f}]"


def replace_block(page: str, name: str, body: str) -> str:
    """`page` with the text between NAME's markers replaced by `body`."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    pattern = re.compile(rf"{re.escape(begin)}\n.*?{re.escape(end)}", re.S)
    if not pattern.search(page):
        raise ValueError(f"no '{begin}' ... '{end}' block in the page")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", page, count=1)


def update_page(page_path: Path, blocks: dict[str, str]) -> None:
    page = page_path.read_text()
    for name, body in blocks.items():
        page = replace_block(page, name, body)
    tmp = page_path.with_name(page_path.name + ".tmp")
    tmp.write_text(page)
    tmp.replace(page_path)
