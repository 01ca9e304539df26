"""A robustness probe: held-out sentences spoken by synthesisers the corpus may not train on.

The synthetic test set measures voices of the engines the model trained on (eSpeak NG, piper,
and Flite when a corpus has a Flite share). A user's speech comes from elsewhere, so this writes
a second test set from the system's CMU Flite voices (`flite`) and Festival voices
(`text2wave`), clean (no noise or reverberation), at each engine's own sample rate:

    python -m edgestream.bench.other_voices --manifest runs/asr/corpus20/test.jsonl \\
        --out runs/asr/other-voices --limit 120
    edgestream bench asr --manifest runs/asr/other-voices/test.jsonl

Groups are `flite-<voice>` and `festival-<voice>`; sentences are dealt to voices in turn.
Engines that are not installed are left out with a note (Debian/Ubuntu: `apt install flite
festival festvox-kdlpc16k festvox-us-slt-hts`).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from edgestream.asr.voices import Flite, FliteVoice
from edgestream.bench.probes import print_manifest_or_exit, probe_parser, write_probe_files

FLITE_VOICES = ("kal16", "awb", "rms", "slt")
FESTIVAL_VOICES = ("ked_diphone", "cmu_us_slt_arctic_hts")


@functools.cache
def _flite() -> Flite:  # lists its voices once, not per sentence
    return Flite()


@dataclass(frozen=True)
class Voice:
    engine: str  # "flite" or "festival"
    name: str

    @property
    def group(self) -> str:
        return f"{self.engine}-{self.name}"

    def speak(self, text: str, wav: Path) -> None:
        if self.engine == "flite":  # the voice's own prosody: nothing drawn
            samples, rate = _flite().synthesize(text, FliteVoice(self.name))
            sf.write(wav, samples, rate, subtype="PCM_16", format="WAV")
        else:
            command = ["text2wave", "-eval", f"(voice_{self.name})", "-o", str(wav)]
            subprocess.run(command, input=text.encode(), check=True, capture_output=True)


def available_voices() -> list[Voice]:
    voices = []
    if shutil.which("flite"):
        voices += [Voice("flite", name) for name in FLITE_VOICES]
    else:
        print("note: flite missing, its voices left out", file=sys.stderr)
    if shutil.which("text2wave"):
        voices += [Voice("festival", name) for name in FESTIVAL_VOICES]
    else:
        print("note: festival (text2wave) missing, its voices left out", file=sys.stderr)
    return voices


def write_probe(manifest: Path, out: Path, limit: int, voices: list[Voice]) -> Path:
    """Speak the first `limit` sentences of `manifest`, dealt to `voices` in turn; returns the
    new manifest (`out/test.jsonl`, written last and atomically)."""
    if not voices:
        raise FileNotFoundError("no synthesiser found: install flite or festival")
    texts = [json.loads(line)["text"] for line in manifest.read_text("utf-8").splitlines()]
    items = []
    for index, text in enumerate(texts[:limit]):
        voice = voices[index % len(voices)]
        speak = functools.partial(voice.speak, text)
        items.append((f"{index:04d}-{voice.group}.wav", text, voice.group, speak))
    return write_probe_files(out, items)


def main() -> None:
    parser = probe_parser(__doc__, "sentences to speak")
    parser.add_argument("--limit", type=int, default=120, help="sentences to speak")
    args = parser.parse_args()
    print_manifest_or_exit(
        lambda: write_probe(args.manifest, args.out, args.limit, available_voices()),
        (OSError, ValueError, KeyError, subprocess.CalledProcessError),
    )


if __name__ == "__main__":
    main()
