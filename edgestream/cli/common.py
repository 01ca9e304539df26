"""What every command shares: the Typer apps, the error rule, options declared once, and
loading helpers.

Every command turns bad input (ValueError, and OSError such as a missing file or a path that
cannot be written) into one line on stderr and exit code 2 (`user_errors`); tracebacks are for
bugs only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console

from edgestream.asr.lm import LM_BEAM

if TYPE_CHECKING:
    from edgestream.llm.tree import TreeShape

P = ParamSpec("P")


R = TypeVar("R")


app = typer.Typer(
    name="edgestream",
    help="Fast, private, on-device transformer inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


bench_app = typer.Typer(help="Benchmarks that print ratios against a baseline run alongside.")


app.add_typer(bench_app, name="bench")


train_app = typer.Typer(help="Train the models edgestream ships (on this CPU).")


app.add_typer(train_app, name="train")


asr_app = typer.Typer(help="Speech recognition data and tools.")


app.add_typer(asr_app, name="asr")


numerics_app = typer.Typer(help="Low-precision numerics: pre-normalizers, float16-safe ops.")


app.add_typer(numerics_app, name="numerics")


export_app = typer.Typer(help="Export models for edge runtimes.")


app.add_typer(export_app, name="export")


stderr = Console(stderr=True, highlight=False)


# = edgestream.llm.methods.METHODS (+ bench.spec.REFERENCE_METHODS), here so --help needs no torch
METHODS = ("ar", "ss", "ss-pld", "pld", "medusa", "draft")


BENCH_METHODS = (*METHODS, "hf-pld", "llamacpp")


BACKEND_HELP = (
    "torch, accelerator (the (B,C,1,S) graph), onnx (an exported .onnx model), coreml (an "
    "exported .mlpackage, macOS only) or auto (by the model file's suffix)."
)


# Options that several commands share, declared once.
ChunkMs = Annotated[int, typer.Option(help="Streaming chunk (multiple of 40 ms).")]


LeftChunks = Annotated[int, typer.Option(help="Attention context, in chunks.")]


def unwritable(path: Path) -> str | None:
    """Why a file can not be written at `path` (its missing folders made first), or None."""
    if path.is_dir():
        return "is a folder; expected a file path"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK):
        return f"cannot write in {folder}"
    return None


def exit_with_error(message: str) -> NoReturn:
    """The error rule: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def writable_file(option: str) -> Callable[[Path | None], Path | None]:
    """A typer callback for an output file option, checked as the command line is parsed: a
    benchmark or a training run must not run for minutes and then fail to write its result."""

    def check(path: Path | None) -> Path | None:
        problem = None if path is None else unwritable(path)
        if problem:
            exit_with_error(f"{option} {path}: {problem}")
        return path

    return check


JsonReport = Annotated[
    Path | None,
    typer.Option("--json", help="Also write JSON here.", callback=writable_file("--json")),
]


AsrModelName = Annotated[str, typer.Option(help="'default' (bundled) or a model file.")]


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report bad input as `error: ...` on stderr with exit code 2, without a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (ValueError, OSError) as err:
            exit_with_error(str(err).splitlines()[0] if str(err) else type(err).__name__)

    return wrapper


def quiet_libraries() -> None:
    # transformers' progress bars and advice would drown our output; our errors say enough.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def set_threads(threads: int | None) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)


class TextStreamer:
    """Prints an answer's text to stdout as its tokens arrive (see `TextDeltas`)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        from edgestream.llm.loading import TextDeltas

        self.deltas = TextDeltas(decode)

    def __call__(self, token: int) -> None:
        sys.stdout.write(self.deltas(token))
        sys.stdout.flush()

    @property
    def printed(self) -> int:
        """Characters printed so far."""
        return self.deltas.sent


class PartialLine:
    """The partial transcript on stderr. On a terminal one line is rewritten in place; in a
    log or a pipe, where escape codes would be noise, each partial gets a line of its own, or
    none at all with `terminal_only`."""

    def __init__(self, terminal_only: bool = False) -> None:
        self.terminal = sys.stderr.isatty()
        self.enabled = self.terminal or not terminal_only
        self.showing = False

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        if self.terminal:
            sys.stderr.write(f"\r\x1b[K{text[-150:]}")
            self.showing = True
        else:
            sys.stderr.write(f"{text}\n")
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the rewritten line before anything else is printed."""
        if self.showing:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.showing = False


DraftModelPath = Annotated[
    Path | None,
    typer.Option(help="Draft model weights for --method draft (`edgestream train draft`)."),
]


MedusaHeadsPath = Annotated[
    Path | None,
    typer.Option(help="Medusa head weights for --method medusa (`edgestream train medusa`)."),
]


PRECISION_HELP = (
    "float32, bfloat16 or q4_1 (the GGUF's own 4-bit weights in the decoder's linear layers, "
    "bfloat16 inputs to them, float32 elsewhere; outputs differ from float32's at near-ties, "
    "as bfloat16's do)."
)


DraftDtype = Annotated[
    str,
    typer.Option(
        help="Precision the streams and Medusa heads draft in: auto (under a float32 model, "
        "bfloat16 on CPUs with native bfloat16, else int8 on x86), float32, bfloat16 or int8 "
        "(int8 weights, float32 arithmetic; the draft model of --method draft follows int8 "
        "only). The output does not change."
    ),
]


TreeNodes = Annotated[
    int | None,
    typer.Option(help="Draft tree size, root included (ss, ss-pld, medusa; default 8)."),
]


TreeTopK = Annotated[
    str | None,
    typer.Option(
        help="Candidates per draft depth, comma-separated; the count sets the depth "
        "(ss, ss-pld, medusa; default 8,6,4,2)."
    ),
]


TreeMinProb = Annotated[
    float,
    typer.Option(
        help="Leave out draft paths the drafter gives less than this probability "
        "(ss, ss-pld, medusa; default 0: off, measured best in docs/speculative-streaming.md)."
    ),
]


ContextDrafts = Annotated[
    bool,
    typer.Option(
        help="ss, ss-pld: let the streams also draft the prompt's and the answer's tokens "
        "that their draft vocabulary lacks. The output does not change."
    ),
]


def tree_shape(nodes: int | None, top_k: str | None, min_prob: float = 0.0) -> TreeShape:
    """The draft tree from --tree-nodes, --tree-top-k and --tree-min-prob; defaults where
    not given."""
    from edgestream.llm.tree import TreeShape, parse_counts

    default = TreeShape()
    ks = default.top_k if top_k is None else parse_counts(top_k, "--tree-top-k")
    if nodes is not None and nodes < 1:
        raise ValueError(f"--tree-nodes must be at least 1, got {nodes}")
    if not 0.0 <= min_prob < 1.0:
        raise ValueError(f"--tree-min-prob must be in [0, 1), got {min_prob}")
    return TreeShape(ks, default.max_nodes if nodes is None else nodes, min_prob)


AdapterPath = Annotated[
    Path | None,
    typer.Option(help="Fine-tuned adapter (`train streams --mode shared|lora`): merged first."),
]


def load_for_decoding(model: str, dtype: str, adapter: Path | None) -> tuple[object, object]:
    """The language model, with an adapter's LoRA merged in when given, and the adapter's
    streams (None without an adapter or for a next-token-only one)."""
    from edgestream.llm.loading import load_language_model

    if adapter is None:
        return load_language_model(model, dtype), None
    if not adapter.is_file():
        raise ValueError(f"--adapter {str(adapter)!r}: no such file")
    if dtype == "q4_1":
        # The adapter's LoRA changes the very weights the 4-bit blocks hold.
        raise ValueError("--adapter needs --dtype float32 or bfloat16, not q4_1")
    from edgestream.llm.shared import load_adapter

    lm = load_language_model(model, dtype, pack=False)
    streams, _ = load_adapter(adapter, lm)
    return lm, streams


def check_baseline_weights(methods: list[str], medusa: Path | None, draft: Path | None) -> None:
    """Before any model loads: the Medusa and draft baselines ship no weights, so the user's
    must be given and exist."""
    for name, path, what in (("medusa", medusa, "heads"), ("draft", draft, "a draft model")):
        if name in methods and path is None:
            raise ValueError(
                f"--method {name} needs {what}: train with `edgestream train {name}` "
                f"and pass --{name} PATH"
            )
        if path is not None and not path.is_file():
            raise ValueError(f"--{name} {str(path)!r}: no such file")


def read_prompts(path: Path | None) -> list[str]:
    from edgestream.bench.generate import DEFAULT_PROMPTS

    if path is None:
        return list(DEFAULT_PROMPTS)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} has no prompts (one per line)")
    return prompts


LmName = Annotated[
    str,
    typer.Option(
        "--lm",
        help="Word LM for beam search: 'default' (bundled), 'none', or an ARPA file.",
    ),
]


Beam = Annotated[
    int | None,
    typer.Option(
        help="CTC prefix beam width; 0 decodes greedily, without the LM "
        f"(default: {LM_BEAM} with an LM, else 0).",
    ),
]


Rescore = Annotated[
    str,
    typer.Option(
        help="Rescore each segment's best candidates with a language model: 'none', "
        "'smollm2', or a model folder or GGUF file (loading it takes ~15 s and ~0.6 GB).",
    ),
]


RescoreAdapter = Annotated[
    str,
    typer.Option(
        help="LoRA adapter merged into the rescoring model: 'default' (for smollm2, the bundled "
        "adapter trained on transcript text by `train rescorer`; none for other models), "
        "'none', or an adapter file.",
    ),
]


VadOption = Annotated[
    bool,
    typer.Option(help="End segments on Silero VAD's silence instead of CTC blanks (silero-vad)."),
]


EndpointSilence = Annotated[
    float | None,
    typer.Option(
        help="Seconds of silence after words that end a segment (the endpoint) [default: 1.2]; "
        "shorter answers live speech sooner and suits recordings of several sentences (0.9 "
        "measured better there) but may cut a sentence at a pause."
    ),
]


def streaming_options(
    chunk_ms: int,
    left_chunks: int,
    beam: int | None,
    lm: str,
    vad: bool = False,
    rescore: str = "none",
    rescore_adapter: str = "default",
    endpoint_silence: float | None = None,
) -> object:
    """The recognizer's options from the command line: `recommended_options` with the user's
    changes (`beam` None: the recommended width, or LM_BEAM for rescoring without an LM)."""
    from edgestream.asr.streaming import recommended_options
    from edgestream.asr.vad import SileroVad

    if beam == 0:
        lm = "none"
        if rescore != "none":
            raise ValueError("--rescore needs beam search's candidates: drop --beam 0")
    if endpoint_silence is not None and not endpoint_silence > 0:
        raise ValueError(f"--endpoint-silence must be positive, got {endpoint_silence}")
    changes = {} if endpoint_silence is None else {"silence_after_text_s": endpoint_silence}
    options = recommended_options(
        lm,
        chunk_ms=chunk_ms,
        left_chunks=left_chunks,
        vad=SileroVad() if vad else None,
        **changes,
    )
    if beam is not None:
        options = replace(options, beam=beam)
    elif rescore != "none":
        options = replace(options, beam=LM_BEAM)
    if rescore == "none":
        return options
    from edgestream.assist.rescore import load_rescorer

    return replace(options, rescorer=load_rescorer(rescore, adapter=rescore_adapter))


def write_report(report: object, json_path: Path | None) -> None:
    """Write a report as JSON when asked (`--json PATH`), its folder made if need be."""
    if json_path is None:
        return
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")
    except OSError as err:  # e.g. a full disk, after the run: the table above has the results
        raise ValueError(f"could not write {json_path}: {err.strerror or err}") from err
    stderr.print(f"wrote {json_path}")


def show_report(table: object, report: object, json_path: Path | None) -> None:
    """Print a benchmark's table; write its report as JSON too when asked."""
    Console().print(table)
    write_report(report, json_path)


def training_bar(rank: int) -> object:
    """The progress display of every training command: shown on rank 0 only."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=stderr, disable=rank != 0)


@contextlib.contextmanager
def training_progress(
    kind: str, steps: int, rank: int, started: float
) -> Iterator[tuple[object, Callable[[int, float, list[float]], None]]]:
    """A rich progress display (rank 0 only) and the per-step report that feeds it; every 50
    steps a lasting line too, for logs."""
    import time

    with training_bar(rank) as bar:
        task = None

        def report(step: int, loss: float, accuracy: list[float]) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task("training", total=steps, info="")
            acc = " ".join(f"{a:.2f}" for a in accuracy)
            info = f"loss {loss:.3f}  top-1 per {kind} {acc}"
            bar.update(task, completed=step, info=info)
            if step % 50 == 0:
                bar.console.print(f"step {step}/{steps}  {info}  {time.time() - started:.0f} s")

        yield bar, report
