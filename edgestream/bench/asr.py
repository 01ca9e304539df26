"""ASR benchmark: WER and real-time factor of the streaming recognizer, overall and per group,
on one thread and on two, with pocketsphinx on the same manifest as an outside reference.

Every utterance goes through the streaming `Recognizer` exactly as `edgestream transcribe`
runs it (100 ms pieces), so the RTF is that of live streaming, not of an offline batch.
WER is jiwer's over lower-cased text stripped of punctuation, pooled over utterances (total
errors / total reference words), as a fraction; CER likewise over characters (spaces count),
which tells a near-miss spelling ("scyve" for "sky") from a wrong word. Per-utterance
references and hypotheses can be written out to read the errors.

`continuous`: the utterances of each group, in manifest order, played as streams of eight with
a pause after each, as a speaker who goes on would produce them; each stream is scored as one
utterance against its joined references. Live speech is like that, and a recognizer whose
attention looks seconds back then hears the previous sentence there (docs/asr.md).
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np
import soundfile as sf

from edgestream.asr.audio import read_audio
from edgestream.asr.backends import load_streaming_model, resolve_backend
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.transcribe import transcribe_file
from edgestream.bench.environment import peak_rss_mib

PROGRESS = Callable[[int, int], None]


@dataclass(frozen=True)
class Utterance:
    audio: Path
    text: str
    group: str


def normalize_text(text: str) -> str:
    """Lower case, letters, digits and apostrophes only, single spaces.

    >>> normalize_text("Hello, World!  It's  2 p.m.")
    "hello world it's 2 p m"
    """
    return " ".join(re.sub(r"[^a-z0-9']+", " ", text.lower()).split())


# Thirteen recordings of human speech that ship with the package (see its README).
REAL_SPEECH_MANIFEST = Path(__file__).parent / "real_speech" / "manifest.jsonl"


def read_bench_manifest(path: Path, limit: int | None = None) -> list[Utterance]:
    """JSON Lines of {"audio" (relative to the manifest), "text", optional "group"};
    the name `real-speech` (where no such file exists) means the bundled recordings."""
    if path == Path("real-speech") and not path.exists():
        path = REAL_SPEECH_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"expected a manifest at {path}, found none")
    utterances = []
    for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            audio, text = entry["audio"], entry["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number}: expected a JSON object with 'audio' and 'text'"
            ) from None
        utterances.append(Utterance(path.parent / audio, text, str(entry.get("group", "all"))))
    if not utterances:
        raise ValueError(f"{path}: no utterances")
    if limit is not None and len(utterances) > limit:  # evenly spaced, so every group stays
        utterances = [utterances[int(i * len(utterances) / limit)] for i in range(limit)]
    return utterances


# Utterances per continuous stream: seven of eight then follow another, and a stream stays
# short enough (about a minute) to score and to compare stream by stream.
STREAM_UTTERANCES = 8


def continuous_streams(
    utterances: list[Utterance], pause_s: float, folder: Path
) -> tuple[list[Utterance], list[str]]:
    """Each group's utterances, in order, joined eight at a time with `pause_s` of digital
    silence after each but the last, written as 16 kHz WAVs into `folder`. Returns the streams
    (text: the references joined) and a stable name for each (its sources joined by " + ")."""
    if pause_s < 0:
        raise ValueError(f"expected a pause of 0 s or more, got {pause_s}")
    groups: dict[str, list[Utterance]] = {}
    for utterance in utterances:
        groups.setdefault(utterance.group, []).append(utterance)
    pause = np.zeros(round(pause_s * 16_000), np.float32)
    streams, names = [], []
    for group, members in groups.items():
        for start in range(0, len(members), STREAM_UTTERANCES):
            parts = members[start : start + STREAM_UTTERANCES]
            pieces = [piece for u in parts for piece in (read_audio(u.audio), pause)][:-1]
            path = folder / f"stream-{len(streams):05d}.wav"
            sf.write(path, np.concatenate(pieces), 16_000, subtype="FLOAT")
            streams.append(Utterance(path, " ".join(u.text for u in parts), group))
            names.append(" + ".join(str(u.audio) for u in parts))
    return streams, names


def _scores(
    utterances: list[Utterance],
    hypotheses: list[str],
    seconds: list[float],
    processing: list[float],
) -> dict[str, dict[str, float]]:
    groups: dict[str, list[int]] = {}
    for i, utterance in enumerate(utterances):
        groups.setdefault(utterance.group, []).append(i)
    table = {}
    for name, members in [("overall", list(range(len(utterances)))), *sorted(groups.items())]:
        references = [normalize_text(utterances[i].text) for i in members]
        said = [normalize_text(hypotheses[i]) for i in members]
        table[name] = {
            "wer": float(jiwer.wer(references, said)),
            "cer": float(jiwer.cer(references, said)),
            "rtf": sum(processing[i] for i in members) / sum(seconds[i] for i in members),
            "utterances": len(members),
            "audio_seconds": round(sum(seconds[i] for i in members), 2),
        }
    return table


def run_edgestream(
    model: str,
    backend: str,
    utterances: list[Utterance],
    options: StreamingOptions,
    threads: int,
    progress: PROGRESS | None = None,
) -> tuple[list[str], list[float], list[float]]:
    """Hypotheses, audio seconds and processing seconds per utterance, on `threads` threads
    (PyTorch's thread count, or the onnxruntime session's)."""
    asr = load_streaming_model(model, backend, threads)
    hypotheses, seconds, processing = [], [], []
    with _torch_threads(threads, resolve_backend(model, backend) != "onnx"):
        for done, utterance in enumerate(utterances, 1):
            result = transcribe_file(asr, utterance.audio, options)
            hypotheses.append(result.text)
            seconds.append(result.duration)
            processing.append(result.rtf * result.duration)
            if progress is not None:
                progress(done, len(utterances))
    return hypotheses, seconds, processing


@contextlib.contextmanager
def _torch_threads(threads: int, needed: bool) -> Iterator[None]:
    """PyTorch's thread count for the block (onnxruntime's is set on its session, and the
    onnx path never imports PyTorch)."""
    if not needed:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def pocketsphinx_available() -> bool:
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return False
    return True


def run_pocketsphinx(
    utterances: list[Utterance], progress: PROGRESS | None = None
) -> tuple[list[str], list[float], list[float]]:
    """The same utterances through pocketsphinx's bundled en-us model (one thread, offline)."""
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=16_000, loglevel="FATAL")
    hypotheses, seconds, processing = [], [], []
    for done, utterance in enumerate(utterances, 1):
        samples = read_audio(utterance.audio)
        pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes()
        began = time.perf_counter()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        hypothesis = decoder.hyp()
        processing.append(time.perf_counter() - began)
        hypotheses.append(hypothesis.hypstr if hypothesis is not None else "")
        seconds.append(len(samples) / 16_000)
        if progress is not None:
            progress(done, len(utterances))
    return hypotheses, seconds, processing


def write_hypotheses(
    path: Path,
    utterances: list[Utterance],
    hypotheses: list[str],
    names: list[str] | None = None,
) -> None:
    """JSON Lines, one per utterance: audio (or its name in `names`), group, reference and
    hypothesis (both normalised, as scored) and the utterance's own WER."""
    names = names or [str(utterance.audio) for utterance in utterances]
    with path.open("w", encoding="utf-8") as out:
        for utterance, hypothesis, name in zip(utterances, hypotheses, names, strict=True):
            reference, said = normalize_text(utterance.text), normalize_text(hypothesis)
            line = {
                "audio": name,
                "group": utterance.group,
                "reference": reference,
                "hypothesis": said,
                "wer": float(jiwer.wer(reference, said)) if reference else float(bool(said)),
            }
            out.write(json.dumps(line) + "\n")


def _decoder_name(options: StreamingOptions) -> str:
    if not options.beam:
        return "greedy"
    name = f"prefix beam {options.beam}" + (" + word LM" if options.lm is not None else "")
    if options.rescorer is not None:
        name += f" + {options.rescorer} of {options.nbest} best"
    return name


def bench_asr(
    model: str,
    utterances: list[Utterance],
    options: StreamingOptions = StreamingOptions(),
    with_pocketsphinx: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    backend: str = "auto",
    hypotheses_path: Path | None = None,
    continuous: float | None = None,
) -> dict[str, object]:
    """The JSON report: model, backend, overall and groups (wer, cer, rtf, rtf_2threads,
    utterances, audio_seconds), and pocketsphinx (or a note saying why it is missing).
    `hypotheses_path`: also write edgestream's per-utterance hypotheses there. `continuous`:
    score streams of utterances this many seconds apart instead (`continuous_streams`;
    `utterances` then counts streams)."""
    if continuous is None:
        report, hypotheses = _bench(
            model, utterances, options, with_pocketsphinx, progress, backend
        )
        if hypotheses_path is not None:
            write_hypotheses(hypotheses_path, utterances, hypotheses)
        return report
    with tempfile.TemporaryDirectory(prefix="edgestream-continuous-") as folder:
        streams, names = continuous_streams(utterances, continuous, Path(folder))
        report, hypotheses = _bench(model, streams, options, False, progress, backend)
    if hypotheses_path is not None:
        write_hypotheses(hypotheses_path, streams, hypotheses, names)
    report["continuous"] = {
        "pause_s": continuous,
        "utterances_per_stream": STREAM_UTTERANCES,
        "source_utterances": len(utterances),
    }
    report["pocketsphinx"] = {"note": "not run on continuous streams"}
    return report


def _bench(
    model: str,
    utterances: list[Utterance],
    options: StreamingOptions,
    with_pocketsphinx: bool,
    progress: Callable[[str, int, int], None] | None,
    backend: str,
) -> tuple[dict[str, object], list[str]]:
    """bench_asr's report on these utterances, and edgestream's hypotheses."""

    def stage(name: str) -> PROGRESS | None:
        return None if progress is None else (lambda done, total: progress(name, done, total))

    runs = {n: stage(f"{n} thread{'s' * (n > 1)}") for n in (1, 2)}
    hypotheses, seconds, one = run_edgestream(model, backend, utterances, options, 1, runs[1])
    _, _, two = run_edgestream(model, backend, utterances, options, 2, runs[2])
    table = _scores(utterances, hypotheses, seconds, one)
    table_two = _scores(utterances, hypotheses, seconds, two)
    for name, row in table.items():
        row["rtf_2threads"] = table_two[name]["rtf"]
    peak = peak_rss_mib()  # before pocketsphinx runs in this process too
    report: dict[str, object] = {
        "model": model,
        "peak_rss_mib": None if peak is None else round(peak, 1),
        "backend": backend
        if backend != "auto"
        else ("onnx" if model.endswith(".onnx") else "torch"),
        "chunk_ms": options.chunk_ms,
        "left_chunks": options.left_chunks,
        "decoder": _decoder_name(options),
        "endpointing": "silero-vad" if options.vad is not None else "ctc blanks",
        "endpoint_silence_s": options.silence_after_text_s,
        "overall": table.pop("overall"),
        "groups": table,
    }
    if with_pocketsphinx and pocketsphinx_available():
        sphinx_hyps, sphinx_seconds, sphinx_time = run_pocketsphinx(
            utterances, stage("pocketsphinx")
        )
        sphinx = _scores(utterances, sphinx_hyps, sphinx_seconds, sphinx_time)
        report["pocketsphinx"] = {"overall": sphinx.pop("overall"), "groups": sphinx}
    else:
        report["pocketsphinx"] = {"note": "not run: pip install pocketsphinx"}
    return report, hypotheses
