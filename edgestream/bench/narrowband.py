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

from collections.abc import Callable
from pathlib import Path

import soundfile as sf
import soxr

from edgestream.bench.asr import read_bench_manifest
from edgestream.bench.probes import print_manifest_or_exit, probe_parser, write_probe_files


def write_narrowband(
    manifest: Path, out: Path, rate: int = 8_000, limit: int | None = None
) -> Path:
    """Rewrite `manifest`'s audio at `rate` Hz into `out`; returns the new manifest
    (`out/test.jsonl`, written last and atomically). Files already there are kept."""
    if not 1_000 <= rate <= 48_000:
        raise ValueError(f"expected a sample rate from 1000 to 48000 Hz, got {rate}")

    def resampled(path: Path) -> Callable[[Path], None]:
        def write(temporary: Path) -> None:
            samples, source_rate = sf.read(path, dtype="float32", always_2d=True)
            narrow = soxr.resample(samples, source_rate, rate)
            sf.write(temporary, narrow, rate, subtype="PCM_16", format="WAV")

        return write

    utterances = read_bench_manifest(manifest, limit)
    items = (
        (f"{index:05d}.wav", u.text, u.group, resampled(u.audio))
        for index, u in enumerate(utterances)
    )
    return write_probe_files(out, items)


def main() -> None:
    parser = probe_parser(__doc__, "utterances to rewrite")
    parser.add_argument("--rate", type=int, default=8_000, help="sample rate to write (Hz)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many utterances")
    args = parser.parse_args()
    print_manifest_or_exit(
        lambda: write_narrowband(args.manifest, args.out, args.rate, args.limit),
        (OSError, ValueError, sf.LibsndfileError),
    )


if __name__ == "__main__":
    main()
