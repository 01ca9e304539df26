"""Where the shared task data lives: a path option, `$EDGESTREAM_DATA`, else `../shared/data`.

Both engines read text from `<data>/llm`; a user's machine may have no such folder, so every
reader takes the directory as an argument and fails with a clear message when it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "EDGESTREAM_DATA"


def default_data_dir() -> Path:
    """The shared data folder: $EDGESTREAM_DATA, else `../shared/data` relative to the cwd."""
    override = os.environ.get(DATA_ENV)
    return Path(override) if override else Path("..") / "shared" / "data"


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """`data_dir` (or `default_data_dir()`), checked to hold the `llm/` text folder."""
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    if not (path / "llm").is_dir():
        raise FileNotFoundError(
            f"expected the shared data folder with an llm/ subfolder at {path.resolve()}, "
            f"but it does not exist: pass the data directory or set ${DATA_ENV}"
        )
    return path
