"""The `edgestream` command line: generate text, and benchmark.

Every command turns bad input (ValueError, FileNotFoundError from the library) into one line on
stderr and exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console

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

stderr = Console(stderr=True, highlight=False)

METHODS = ("ar",)


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report bad input as `error: ...` on stderr with exit code 2, without a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (ValueError, FileNotFoundError) as err:
            message = str(err).splitlines()[0] if str(err) else type(err).__name__
            print(f"error: {message}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper


def _quiet_libraries() -> None:
    # transformers' progress bars and advice would drown our output; our errors say enough.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _set_threads(threads: int | None) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)


class _TextStreamer:
    """Prints decoded text as tokens arrive, holding back incomplete UTF-8 characters."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.printed = 0

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)


@app.command()
@user_errors
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt (a user message when --chat).")],
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    method: Annotated[str, typer.Option(help=f"Decoding method: {', '.join(METHODS)}.")] = "ar",
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on new tokens.")] = 256,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--no-chat", help="Apply the chat template (default: if the model has one)."
        ),
    ] = None,
    temperature: Annotated[float, typer.Option(help="0 decodes greedily.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Random seed for sampling.")] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a reply to PROMPT and report its speed."""
    from edgestream.llm.engine import Sampling, generate_ar
    from edgestream.llm.loading import load_language_model, parse_dtype

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    parse_dtype(dtype)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    _set_threads(threads)
    _quiet_libraries()

    lm = load_language_model(model, dtype)
    prompt_ids = lm.encode_prompt(prompt, chat)
    streamer = None if json_output else _TextStreamer(lm.decode)
    result = generate_ar(lm.model, prompt_ids, max_new_tokens, lm.stop_ids, sampling, streamer)
    text = lm.decode(result.token_ids)
    if json_output:
        record = {
            "text": text,
            "token_ids": result.token_ids,
            "new_tokens": result.new_tokens,
            "forward_passes": result.forward_passes,
            "seconds": round(result.seconds, 4),
            "tokens_per_second": round(result.tokens_per_second, 2),
            "mean_accepted": round(result.mean_accepted, 3),
            "method": method,
            "model": model,
            "dtype": dtype,
            "prompt_tokens": len(prompt_ids),
            "finish_reason": result.finish_reason,
        }
        print(json.dumps(record, ensure_ascii=False))
        return
    assert streamer is not None
    sys.stdout.write(text[streamer.printed :] + "\n")
    stderr.print(
        f"[dim]{result.new_tokens} tokens in {result.seconds:.2f} s: "
        f"{result.tokens_per_second:.1f} tokens/s, {result.mean_accepted:.2f} tokens/pass "
        f"({method}, {dtype}, {model}; stopped: {result.finish_reason})[/dim]"
    )


def _read_prompts(path: Path | None) -> list[str]:
    from edgestream.bench.generate import DEFAULT_PROMPTS

    if path is None:
        return list(DEFAULT_PROMPTS)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} has no prompts (one per line)")
    return prompts


@bench_app.command("generate")
@user_errors
def bench_generate_command(
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    dtypes: Annotated[str, typer.Option(help="Comma-separated dtypes.")] = "float32,bfloat16",
    prompts: Annotated[
        Path | None, typer.Option(help="Text file, one prompt per line (default: a built-in set).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on new tokens.")] = 128,
    repeats: Annotated[int, typer.Option(help="Timed runs per prompt; the median counts.")] = 3,
    threads: Annotated[int, typer.Option(help="CPU threads for both engines.")] = 2,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Our AR engine vs transformers' generate: tokens/s and speedup, interleaved in one run."""
    from rich.table import Table

    from edgestream.bench.generate import bench_generate
    from edgestream.llm.loading import parse_dtype

    dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
    for d in dtype_list:
        parse_dtype(d)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    prompt_list = _read_prompts(prompts)
    _quiet_libraries()
    done = 0

    def progress(prompt: str) -> None:
        nonlocal done
        done += 1
        stderr.print(f"[dim]{done}/{len(prompt_list) * len(dtype_list)} {prompt[:60]}[/dim]")

    report = bench_generate(
        model, dtype_list, prompt_list, max_new_tokens, repeats, threads, progress
    )
    setup = report["setup"]
    table = Table(title=f"AR decoding, {setup['model']}, {setup['cpu']}, {threads} threads")
    for column in ("dtype", "ours tok/s", "transformers tok/s", "speedup", "per-prompt", "exact"):
        table.add_column(column, justify="right")
    for r in report["results"]:
        table.add_row(
            r["dtype"],
            f"{r['ours_tokens_per_second']:.1f}",
            f"{r['transformers_tokens_per_second']:.1f}",
            f"{r['speedup']:.2f}x",
            f"{r['per_prompt_speedup_median']:.2f} "
            f"[{r['per_prompt_speedup_min']:.2f}-{r['per_prompt_speedup_max']:.2f}]",
            f"{r['exact_match']:.2f}",
        )
    Console().print(table)
    stderr.print(
        f"[dim]{setup['prompts']} chat prompts, <= {max_new_tokens} new tokens, greedy, "
        f"median of {repeats}, prefill included; torch {setup['torch']}, "
        f"transformers {setup['transformers']}[/dim]"
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
