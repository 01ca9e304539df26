"""What the probe-writing commands (`other_voices`, `narrowband`) share: each writes a folder
of WAV files plus `test.jsonl` for `edgestream bench asr`, resumably, and is run as a module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import soundfile as sf

from edgestream.asr.manifest import ManifestEntry, write_manifest

# (file name, text, group, a function that writes the audio to the path it is given)
ProbeItem = tuple[str, str, str, Callable[[Path], None]]


def write_probe_files(out: Path, items: Iterable[ProbeItem]) -> Path:
    """Write each item's audio into `out` (kept where already there; each file renamed into
    place once complete), then `out/test.jsonl`, last and atomically; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, text, group, write_audio in items:
        wav = out / name
        if not wav.exists():
            temporary = wav.with_name(f".{wav.name}.tmp.wav")
            write_audio(temporary)
            os.replace(temporary, wav)
        entries.append(ManifestEntry(name, text, round(sf.info(wav).duration, 4), group))
    target = out / "test.jsonl"
    write_manifest(target, entries)
    return target


def probe_parser(doc: str, manifest_help: str) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first paragraph, with the `--manifest` and `--out` every
    probe takes."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, required=True, help=manifest_help)
    parser.add_argument("--out", type=Path, required=True, help="folder for audio + test.jsonl")
    return parser


def print_manifest_or_exit(write: Callable[[], Path], errors: tuple[type[Exception], ...]) -> None:
    """Print the manifest `write` returns, or, on one of `errors`, a one-line message and exit
    code 2."""
    try:
        print(write())
    except errors as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
