"""JSON Lines manifests: one utterance per line, `{"audio": path relative to the manifest,
"text", "duration" (seconds), "group"}`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ManifestEntry:
    audio: str  # relative to the manifest's folder
    text: str
    duration: float  # seconds
    group: str = ""


def read_manifest(path: str | Path) -> list[ManifestEntry]:
    """Entries of a JSON Lines manifest (`audio`, `text`, optional `duration` and `group`)."""
    entries = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "audio" not in row or "text" not in row:
                raise ValueError(f"{path}:{number}: expected keys audio and text, got {list(row)}")
            entries.append(
                ManifestEntry(
                    row["audio"],
                    row["text"],
                    float(row.get("duration", 0.0)),
                    str(row.get("group", "")),
                )
            )
    return entries


def write_manifest(path: str | Path, entries: Sequence[ManifestEntry]) -> None:
    """Write a manifest atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(asdict(entry), ensure_ascii=False) + "\n")
    os.replace(temporary, path)
