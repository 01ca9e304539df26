"""The `edgestream` command line: one module per engine (`llm`, `asr`, `assist`, `numerics`),
`bench` for every benchmark, `common` for what they share."""

# ruff: noqa: I001 (the command modules are imported in the order --help lists them)

from __future__ import annotations

import sys

# Importing the command modules registers their commands, in this order in --help: the
# language model's first, then speech, the assistant, and the groups.
from edgestream.cli import llm  # noqa: F401
from edgestream.cli import asr, assist, bench, numerics  # noqa: F401
from edgestream.cli.common import BENCH_METHODS, LM_BEAM, METHODS, app

__all__ = ["BENCH_METHODS", "LM_BEAM", "METHODS", "app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
