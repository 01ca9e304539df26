"""Speech commands: `transcribe`, `asr synth|lm`, `train asr` and `export asr`."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgestream.cli.common import (
    BACKEND_HELP,
    AsrModelName,
    Beam,
    ChunkMs,
    EndpointSilence,
    LeftChunks,
    LmName,
    PartialLine,
    Rescore,
    RescoreAdapter,
    VadOption,
    app,
    asr_app,
    exit_with_error,
    export_app,
    set_threads,
    stderr,
    streaming_options,
    train_app,
    training_bar,
    user_errors,
    writable_file,
)

if TYPE_CHECKING:
    from edgestream.asr.streaming import Segment, StreamingModel, StreamingOptions
    from edgestream.asr.transcribe import Transcript


@asr_app.command("synth")
@user_errors
def asr_synth_command(
    out: Annotated[Path, typer.Option(help="Corpus folder (resumed if it exists).")],
    hours: Annotated[float, typer.Option(help="Hours of audio to synthesise.")] = 1.0,
    data: Annotated[Path | None, typer.Option(help="Shared data folder (sentence source).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (the corpus is deterministic).")] = 0,
    workers: Annotated[int, typer.Option(help="Parallel synthesis processes.")] = 2,
    piper_fraction: Annotated[
        float | None,
        typer.Option(help="Share of train and dev hours spoken by piper [default: 0.25]."),
    ] = None,
    flite_fraction: Annotated[
        float,
        typer.Option(
            help="Share of train and dev hours spoken by CMU Flite voices (needs the flite "
            "command); above 0 the test set gains Flite groups."
        ),
    ] = 0.0,
    splits: Annotated[
        str,
        typer.Option(
            help="Comma-separated splits to synthesise, e.g. dev,test to evaluate a model "
            "without the training hours (the same utterances as the whole corpus)."
        ),
    ] = "train,dev,test",
) -> None:
    """Synthesise a speech corpus (16 kHz WAV + JSON Lines manifests) from TTS voices."""
    from rich.progress import Progress

    from edgestream.asr.synth import SynthConfig, synthesize_corpus

    if hours <= 0:
        raise ValueError(f"--hours must be positive, got {hours}")
    shares = {"flite_fraction": flite_fraction}
    if piper_fraction is not None:
        shares["piper_fraction"] = piper_fraction
    config = SynthConfig(**shares)
    with Progress(console=stderr, transient=True) as bar:  # a refusal leaves its line alone
        task = bar.add_task("synthesising", total=None)
        summary = synthesize_corpus(
            out,
            hours,
            data,
            seed,
            workers,
            config,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            splits=[s.strip() for s in splits.split(",") if s.strip()],
        )
    for split, groups in summary.seconds.items():
        detail = ", ".join(f"{g} {sec / 3600:.2f} h" for g, sec in sorted(groups.items()))
        stderr.print(f"{split}: {summary.manifests[split]} ({detail})")


@asr_app.command("lm")
@user_errors
def asr_lm_command(
    out: Annotated[
        Path,
        typer.Option(
            help="ARPA file to write (.arpa, or .arpa.gz compressed).",
            callback=writable_file("--out"),
        ),
    ],
    text: Annotated[
        Path | None, typer.Option(help="Plain text to learn from (default: the task text).")
    ] = None,
    data: Annotated[Path | None, typer.Option(help="Shared data folder (sentence source).")] = None,
    order: Annotated[int, typer.Option(help="n-gram order.")] = 3,
    min_counts: Annotated[
        str, typer.Option(help="Comma-separated count cut-off per order, lowest first.")
    ] = "1,1,2",
) -> None:
    """Build a word n-gram language model (Kneser-Ney, ARPA) for beam search.

    Without --text it learns from the train split of the task text that `asr synth` speaks,
    sentences of every length (never a dev or test sentence); with --text, from any UTF-8
    text, normalised like transcripts (lower case, numbers spelled out)."""
    from edgestream.asr.lm import train_ngram, write_arpa
    from edgestream.asr.text import lm_sentences, text_sentences

    if out.exists():
        raise ValueError(f"{out} exists: choose another --out or remove it")
    try:
        cutoffs = tuple(int(c) for c in min_counts.split(","))
    except ValueError:
        raise ValueError(f"--min-counts must be integers, got {min_counts!r}") from None
    if order < 1 or len(cutoffs) < order:  # now, before the text is read
        raise ValueError(f"--order must be >= 1 with a --min-counts entry per order, got {order}")
    sentences = text_sentences(text) if text is not None else lm_sentences(data)
    with stderr.status(f"counting {len(sentences)} sentences"):
        lm = train_ngram(sentences, order, cutoffs)
        write_arpa(lm, out)
    stderr.print(f"wrote {out}: {lm.size} n-grams from {len(sentences)} sentences")


def _read_config(path: Path) -> dict:
    """`train asr --config`: a JSON object, or a ValueError naming the file and the problem."""
    if not path.is_file():
        raise ValueError(f"--config {path} does not exist")
    try:
        settings = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--config {path} is not JSON: {err}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"--config {path} must hold a JSON object with 'model' and/or 'train'")
    return settings


@train_app.command("asr")
@user_errors
def train_asr_command(
    manifest: Annotated[
        list[Path],
        typer.Option(help="Training manifest (JSON Lines); repeat it to train on several."),
    ],
    dev: Annotated[Path, typer.Option(help="Dev manifest: WER after every epoch.")],
    out: Annotated[Path, typer.Option(help="Run folder (resumed if it holds a checkpoint).")],
    config: Annotated[
        Path | None, typer.Option(help="JSON with 'model' and/or 'train' settings to override.")
    ] = None,
    export: Annotated[
        Path | None,
        typer.Option(help="Also copy the final model here.", callback=writable_file("--export")),
    ] = None,
    init: Annotated[
        str | None, typer.Option(help="Start from this model ('default' or a file).")
    ] = None,
) -> None:
    """Train the streaming Conformer-CTC (also under torchrun --nproc_per_node=N)."""
    import shutil
    import time

    from edgestream.asr.conformer import ConformerConfig
    from edgestream.asr.model_io import resolve_model_path
    from edgestream.asr.train import TrainConfig, train_asr
    from edgestream.training import distributed_context

    for path in (*manifest, dev):
        if not path.is_file():
            raise FileNotFoundError(f"expected a manifest at {path}, found none")
    settings = _read_config(config) if config is not None else {}
    unknown = set(settings) - {"model", "train"}
    if unknown:
        raise ValueError(f"--config: unknown sections {sorted(unknown)}; expected model, train")
    try:
        model_config = ConformerConfig(**settings.get("model", {}))
        train_config = TrainConfig(**settings.get("train", {}))
    except TypeError as error:  # an unknown setting name
        raise ValueError(f"--config: {error}") from None
    rank, world = distributed_context()
    started = time.time()
    with training_bar(rank) as bar:
        task = bar.add_task("training", total=None, info="computing features")

        def report(event: dict[str, float]) -> None:
            if "dev_wer" in event:
                bar.console.print(
                    f"epoch {event['epoch']:.0f}: dev WER {event['dev_wer']:.2%}  "
                    f"{time.time() - started:.0f} s"
                )
                return
            if "averaged_dev_wer" in event:
                bar.console.print(
                    f"average of the last epochs: dev WER {event['averaged_dev_wer']:.2%}"
                )
                return
            info = (
                f"epoch {event['epoch'] + 1:.0f} loss/token {event['loss']:.3f} "
                f"lr {event['lr']:.1e}"
            )
            bar.update(task, completed=event["step"], total=event["steps"], info=info)
            if event["step"] % 50 == 0:  # a lasting record, also when stderr is a log file
                bar.console.print(
                    f"step {event['step']:.0f}/{event['steps']:.0f}  {info}  "
                    f"{time.time() - started:.0f} s"
                )

        final = train_asr(
            manifest,
            dev,
            out,
            model_config,
            train_config,
            report,
            init=None if init is None else resolve_model_path(init),
        )
    if rank == 0:
        if export is not None:
            shutil.copyfile(final, export)
        stderr.print(f"model: {export or final} ({world} processes, {time.time() - started:.0f} s)")


@app.command()
def transcribe(
    audio: Annotated[
        list[Path],
        typer.Argument(help="WAV, FLAC or OGG files, any rate; - reads a WAV stream from a pipe."),
    ],
    model: Annotated[
        str, typer.Option(help="'default' (bundled), a model file, or an exported .onnx file.")
    ] = "default",
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    chunk_ms: ChunkMs = 640,
    left_chunks: LeftChunks = 4,
    beam: Beam = None,
    lm: LmName = "default",
    rescore: Rescore = "none",
    rescore_adapter: RescoreAdapter = "default",
    vad: VadOption = False,
    endpoint_silence: EndpointSilence = None,
    stream: Annotated[bool, typer.Option(help="Print partial results as they come.")] = False,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="JSON Lines output.")] = False,
) -> None:
    """Transcribe audio files with the streaming Conformer-CTC recognizer.

    rtf = processing seconds / audio seconds; first_partial_ms = when the first words would
    have appeared, had the audio arrived live.

    Live: `arecord -f S16_LE -r 16000 | edgestream transcribe - --stream` prints each segment
    on a line of its own as its trailing silence ends it; Ctrl-C ends the stream."""
    from edgestream.asr.audio import STDIN
    from edgestream.asr.backends import load_streaming_model, resolve_backend

    try:
        if threads is not None and threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        if sum(str(path) == STDIN for path in audio) > 1:
            raise ValueError("- (standard input) can be given only once")
        if resolve_backend(model, backend) != "onnx":  # onnxruntime takes them per session
            set_threads(threads)
        asr = load_streaming_model(model, backend, threads)  # a bad model fails before an LLM loads
        options = streaming_options(
            chunk_ms, left_chunks, beam, lm, vad, rescore, rescore_adapter, endpoint_silence
        )
        asr.chunk_encoder(options.left_chunks * options.chunk_frames)  # settings it can run
    except (ValueError, OSError) as err:
        exit_with_error(str(err).splitlines()[0])
    failed = False
    for path in audio:  # a bad file is reported and skipped; the others are still transcribed
        try:
            result = _transcribe_one(asr, path, options, stream, json_output, len(audio) > 1)
        except (ValueError, OSError) as err:
            print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
            failed = True
            continue
        for warning in result.warnings:
            print(f"warning: {path}: {warning}", file=sys.stderr)
        if json_output:
            print(json.dumps(result.to_json()), flush=True)
        elif str(path) != STDIN:  # a live stream's segments are printed already
            print(f"{path}: {result.text}" if len(audio) > 1 else result.text, flush=True)
        if result.interrupted:
            raise typer.Exit(130)  # as a shell reports an interrupted command
    if failed:
        raise typer.Exit(2)


def _transcribe_one(
    asr: StreamingModel,
    path: Path,
    options: StreamingOptions,
    stream: bool,
    json_output: bool,
    prefixed: bool,
) -> Transcript:
    """One input, its partials shown as `transcribe` promises. A live stream (`-`) also prints
    each segment as it closes, since its end may be hours away, and ends on Ctrl-C."""
    from edgestream.asr.audio import STDIN
    from edgestream.asr.transcribe import interrupt_stops, transcribe_file

    line, live = PartialLine(), str(path) == STDIN

    def show(partial: str) -> None:
        if json_output:
            print(json.dumps({"audio": str(path), "partial": partial}), flush=True)
        else:
            line.show(partial)

    def print_segment(segment: Segment) -> None:
        line.clear()
        if json_output:
            record = {"audio": str(path), **segment.to_json()}
            record["segment"] = record.pop("text")
            print(json.dumps(record), flush=True)
        else:
            print(f"{path}: {segment.text}" if prefixed else segment.text, flush=True)

    if not live:
        result = transcribe_file(asr, path, options, show if stream else None)
    else:
        stop = threading.Event()
        with interrupt_stops(stop):
            result = transcribe_file(
                asr, path, options, show if stream else None, print_segment, stop
            )
    line.clear()
    return result


@export_app.command("asr")
@user_errors
def export_asr_command(
    out: Annotated[Path, typer.Option(help="Folder for the exported files.")],
    model: AsrModelName = "default",
    format_: Annotated[
        str, typer.Option("--format", help="onnx (onnxruntime) or coreml (an .mlpackage).")
    ] = "onnx",
    chunk_ms: ChunkMs = 640,
    left_chunks: LeftChunks = 4,
    fp16: Annotated[bool, typer.Option("--fp16", help="Also a float16 model.")] = False,
    int8: Annotated[bool, typer.Option("--int8", help="Also an int8 (dynamic) model.")] = False,
) -> None:
    """Export the streaming step (a chunk and its caches in, log-probs and caches out)."""
    if format_ not in ("onnx", "coreml"):
        raise ValueError(f"unknown format {format_!r}: expected onnx or coreml")
    if format_ == "coreml" and int8:
        raise ValueError("--int8 is for ONNX; Core ML takes --fp16")
    from edgestream.asr.export import export_onnx, max_step_difference
    from edgestream.asr.model_io import load_model

    options = streaming_options(chunk_ms, left_chunks, 0, "none")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    asr = load_model(model)  # a bad name fails before any folder is made
    try:
        out.mkdir(parents=True, exist_ok=True)  # now, not after the export
    except OSError as err:
        raise ValueError(f"--out {out}: cannot make the folder ({err.strerror})") from err
    if format_ == "coreml":
        from edgestream.asr.coreml import export_coreml

        for precision in ("float32", *(["float16"] if fp16 else [])):
            with stderr.status(f"converting ({precision})"):
                path = export_coreml(asr, out, options, precision)
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
            print(f"{path}  {precision}, {size:.1f} MiB (running it needs macOS)")
        return
    precisions = ("float32", *(["float16"] if fp16 else []), *(["int8"] if int8 else []))
    with stderr.status("exporting"):
        written = export_onnx(asr, out, options, precisions)
    for precision, path in written.items():
        difference = max_step_difference(asr, path, options)
        print(
            f"{path}  {precision}, {path.stat().st_size / 2**20:.1f} MiB, "
            f"max |log-prob - PyTorch| {difference:.2g}"
        )
