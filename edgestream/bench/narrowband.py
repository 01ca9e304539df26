"""A band-limited probe: a manifest's utterances rewritten as narrow-band files (8 kHz by default).

Telephone audio, 8 kHz recordings, lossy codecs and old microphones carry little above 4-5 kHz,
while every synthesiser in the corpus speaks up to 8 kHz. This writes each utterance again at
`--rate` (soxr, 16-bit WAV), as a user's file would arrive; `transcribe` and `bench asr` then
resample it up like any other input:

    python -m edgestream.bench.narrowband --manifest runs/asr/corpus20/test.jsonl \\
        --out runs/asr/test-8khz --limit 200
    edgestream bench asr --manifest runs/asr/test-8khz/test.jsonl

Groups and texts are kept; `--limit` takes evenly spaced utterances, as `bench asr` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import soundfile as sf
import soxr

from edgestream.asr.manifest import ManifestEntry, write_manifest
from edgestream.bench.asr import read_bench_manifest


def write_narrowband(
    manifest: Path, out: Path, rate: int = 8_000, limit: int | None = None
) -> Path:
    """Rewrite `manifest`'s audio at `rate` Hz into `out`; returns the new manifest
    (`out/test.jsonl`, written last and atomically). Files already there are kept."""
    if not 1_000 <= rate <= 48_000:
        raise ValueError(f"expected a sample rate from 1000 to 48000 Hz, got {rate}")
    utterances = read_bench_manifest(manifest, limit)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, utterance in enumerate(utterances):
        wav = out / f"{index:05d}.wav"
        if not wav.exists():
            samples, source_rate = sf.read(utterance.audio, dtype="float32", always_2d=True)
            temporary = wav.with_name(f".{wav.name}.tmp.wav")
            narrow = soxr.resample(samples, source_rate, rate)
            sf.write(temporary, narrow, rate, subtype="PCM_16", format="WAV")
            temporary.replace(wav)
        duration = round(sf.info(wav).duration, 4)
        entries.append(ManifestEntry(wav.name, utterance.text, duration, utterance.group))
    target = out / "test.jsonl"
    write_manifest(target, entries)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, required=True, help="utterances to rewrite")
    parser.add_argument("--out", type=Path, required=True, help="folder for audio + test.jsonl")
    parser.add_argument("--rate", type=int, default=8_000, help="sample rate to write (Hz)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many utterances")
    args = parser.parse_args()
    try:
        print(write_narrowband(args.manifest, args.out, args.rate, args.limit))
    except (OSError, ValueError, sf.LibsndfileError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
