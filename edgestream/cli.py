"""The `edgestream` command line: generate text, and benchmark.

Every command turns bad input (ValueError, FileNotFoundError from the library) into one line on
stderr and exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
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
LM_BEAM = 32  # beam width with a language model: dev WER 9.2% at 16, 8.9% at 32 (docs/asr.md)
JsonReport = Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")]
AsrModelName = Annotated[str, typer.Option(help="'default' (bundled) or a model file.")]


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


DraftModelPath = Annotated[
    Path | None,
    typer.Option(help="Draft model weights for --method draft (`edgestream train draft`)."),
]
MedusaHeadsPath = Annotated[
    Path | None,
    typer.Option(help="Medusa head weights for --method medusa (`edgestream train medusa`)."),
]

DraftDtype = Annotated[
    str,
    typer.Option(
        help="Precision the streams and Medusa heads draft in: auto (bfloat16 under a float32 "
        "model on CPUs with native bfloat16), float32 or bfloat16. The output does not change."
    ),
]


AdapterPath = Annotated[
    Path | None,
    typer.Option(help="Fine-tuned adapter (`train streams --mode shared|lora`): merged first."),
]


def _load_for_decoding(model: str, dtype: str, adapter: Path | None) -> tuple[object, object]:
    """The language model, with an adapter's LoRA merged in when given, and the adapter's
    streams (None without an adapter or for a next-token-only one)."""
    from edgestream.llm.loading import load_language_model

    if adapter is None:
        return load_language_model(model, dtype), None
    if not adapter.is_file():
        raise ValueError(f"--adapter {str(adapter)!r}: no such file")
    from edgestream.llm.shared import load_adapter

    lm = load_language_model(model, dtype, pack=False)
    streams, _ = load_adapter(adapter, lm)
    return lm, streams


def _check_baseline_weights(methods: list[str], medusa: Path | None, draft: Path | None) -> None:
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
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for --method ss (default: bundled).")
    ] = None,
    medusa: MedusaHeadsPath = None,
    draft: DraftModelPath = None,
    adapter: AdapterPath = None,
    draft_dtype: DraftDtype = "auto",
    compare: Annotated[
        bool, typer.Option(help="Also decode with ar and report the speedup and exact match.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a reply to PROMPT and report its speed."""
    from edgestream.bench.environment import peak_rss_mib
    from edgestream.llm.engine import Sampling
    from edgestream.llm.loading import parse_dtype
    from edgestream.llm.methods import MethodOptions, drafting_dtype, make_decoder

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    _check_baseline_weights([method], medusa, draft)
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    drafting_dtype(draft_dtype, parse_dtype(dtype))
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    _set_threads(threads)
    _quiet_libraries()

    lm, adapter_streams = _load_for_decoding(model, dtype, adapter)
    options = MethodOptions(
        sampling=sampling,
        streams_path=streams,
        streams=adapter_streams,
        medusa_path=medusa,
        draft_path=draft,
        draft_dtype=draft_dtype,
    )
    decode = make_decoder(method, lm, options)
    prompt_ids = lm.encode_prompt(prompt, chat)
    streamer = None if json_output else _TextStreamer(lm.decode)
    result = decode(prompt_ids, max_new_tokens, streamer)
    text = lm.decode(result.token_ids)
    baseline = None
    if compare and method != "ar":
        ar = make_decoder("ar", lm, MethodOptions(sampling=sampling))
        baseline = ar(prompt_ids, max_new_tokens, None)
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
            "peak_rss_mib": peak_rss_mib(),
        }
        if baseline is not None:
            record["ar_tokens_per_second"] = round(baseline.tokens_per_second, 2)
            record["speedup"] = round(result.tokens_per_second / baseline.tokens_per_second, 3)
            record["exact_match_vs_ar"] = baseline.token_ids == result.token_ids
        print(json.dumps(record, ensure_ascii=False))
        return
    assert streamer is not None
    sys.stdout.write(text[streamer.printed :] + "\n")
    stderr.print(
        f"[dim]{result.new_tokens} tokens in {result.seconds:.2f} s: "
        f"{result.tokens_per_second:.1f} tokens/s, {result.mean_accepted:.2f} tokens/pass "
        f"({method}, {dtype}, {model}; stopped: {result.finish_reason})[/dim]"
    )
    if baseline is not None:
        same = "identical" if baseline.token_ids == result.token_ids else "DIFFERENT"
        stderr.print(
            f"[bold]ar {baseline.tokens_per_second:.1f} tokens/s, {method} "
            f"{result.tokens_per_second:.1f} tokens/s: "
            f"{result.tokens_per_second / baseline.tokens_per_second:.2f}x, output {same}[/bold]"
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
    json_path: JsonReport = None,
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


def _split_methods(methods: str) -> list[str]:
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in BENCH_METHODS]
    if unknown or not names:
        raise ValueError(
            f"unknown method(s) {unknown or methods!r}: expected from {', '.join(BENCH_METHODS)}"
        )
    return names if "ar" in names else ["ar", *names]


@bench_app.command("spec")
@user_errors
def bench_spec_command(
    prompts: Annotated[
        Path | None, typer.Option(help="Spec-Bench question file (JSON Lines).")
    ] = None,
    suite: Annotated[str | None, typer.Option(help="'tasks': held-back task test prompts.")] = None,
    methods: Annotated[
        str, typer.Option(help="Comma-separated methods; ar is always run.")
    ] = "ar,ss",
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on new tokens per turn.")] = 128,
    limit: Annotated[int, typer.Option(help="Prompts per category (suite) or in all (file).")] = 10,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 2,
    temperature: Annotated[
        float, typer.Option(help="0 = greedy; > 0 samples (every method with --seed).")
    ] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling seed, the same for every method.")] = 0,
    streams: Annotated[Path | None, typer.Option(help="Stream weights for ss.")] = None,
    medusa: MedusaHeadsPath = None,
    draft: DraftModelPath = None,
    adapter: AdapterPath = None,
    draft_dtype: DraftDtype = "auto",
    draft_tokens: Annotated[int, typer.Option(help="Tokens drafted per pass (draft).")] = 4,
    pld_tokens: Annotated[int, typer.Option(help="Longest prompt-lookup draft (pld).")] = 10,
    lookup_tokens: Annotated[
        int, typer.Option(help="Longest prompt-lookup branch on the stream tree (ss-pld).")
    ] = 6,
    lookup_alone_ngram: Annotated[
        int,
        typer.Option(
            help="ss-pld: verify a lookup draft alone, without the streams, when at least "
            "this many last tokens matched (0: always graft it onto the stream tree)."
        ),
    ] = 2,
    memory: Annotated[
        bool,
        typer.Option(help="Also measure each method's peak memory in a process of its own."),
    ] = True,
    data: Annotated[
        Path | None, typer.Option(help="Shared data folder (for --suite tasks).")
    ] = None,
    json_path: JsonReport = None,
) -> None:
    """Speculative decoding methods vs AR: speedup, accepted tokens, exact match, per category."""
    from rich.progress import Progress
    from rich.table import Table

    from edgestream.bench.environment import peak_rss_mib
    from edgestream.bench.spec import (
        LLAMACPP_INSTALL,
        REFERENCE_METHODS,
        bench_spec,
        llamacpp_available,
        method_peak_memory,
        read_spec_prompts,
        task_suite,
    )
    from edgestream.llm.engine import Sampling
    from edgestream.llm.loading import parse_dtype
    from edgestream.llm.methods import MethodOptions, drafting_dtype, footprint

    names = _split_methods(methods)
    _check_baseline_weights(names, medusa, draft)
    drafting = drafting_dtype(draft_dtype, parse_dtype(dtype))
    if (prompts is None) == (suite is None):
        raise ValueError("give exactly one of --prompts FILE or --suite tasks")
    if suite is not None and suite != "tasks":
        raise ValueError(f"unknown suite {suite!r}: expected 'tasks'")
    if limit < 1 or max_new_tokens < 1:
        raise ValueError("--limit and --max-new-tokens must be at least 1")
    questions = read_spec_prompts(prompts)[:limit] if prompts else task_suite(limit, data)
    _set_threads(threads)
    _quiet_libraries()
    lm, adapter_streams = _load_for_decoding(model, dtype, adapter)
    if pld_tokens < 1 or lookup_tokens < 1:
        raise ValueError(
            "--pld-tokens and --lookup-tokens must be at least 1, "
            f"got {pld_tokens}, {lookup_tokens}"
        )
    if draft_tokens < 1:
        raise ValueError(f"--draft-tokens must be at least 1, got {draft_tokens}")
    longest_ngram = MethodOptions.pld_ngram
    if not 0 <= lookup_alone_ngram <= longest_ngram:
        raise ValueError(
            f"--lookup-alone-ngram must be between 0 and {longest_ngram}, got {lookup_alone_ngram}"
        )
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    if not sampling.greedy and any(m in REFERENCE_METHODS for m in names):
        raise ValueError("the outside references (hf-pld, llamacpp) are measured greedy only")
    options = MethodOptions(
        sampling=sampling,
        streams_path=streams,
        streams=adapter_streams,
        medusa_path=medusa,
        draft_path=draft,
        draft_tokens=draft_tokens,
        pld_tokens=pld_tokens,
        lookup_tokens=lookup_tokens,
        lookup_alone_ngram=lookup_alone_ngram,
        draft_dtype=draft_dtype,
    )
    if "llamacpp" in names and not llamacpp_available():
        stderr.print(
            f"[yellow]note: llamacpp skipped: llama-cpp-python is not installed "
            f"({LLAMACPP_INSTALL})[/yellow]"
        )
        names.remove("llamacpp")
    decoders = {name: _bench_decoder(name, lm, model, options, threads) for name in names}
    with Progress(console=stderr, transient=True) as bar:
        task = bar.add_task("decoding", total=len(questions))
        report = bench_spec(
            lm,
            decoders,
            questions,
            max_new_tokens,
            threads,
            lambda done, _total: bar.update(task, completed=done),
        )
    if not sampling.greedy:
        report["setup"]["decoding"] = (
            f"sampled: temperature {temperature}, top-p {top_p}, seed {seed} for every prompt "
            "and method; end to end (prefill included)"
        )
    for name in names:
        if name in METHODS:
            report["methods"][name].update(footprint(name, lm, options))
    report["setup"]["peak_memory_mib"] = peak_rss_mib()  # the process, every method loaded
    report["setup"]["options"] = {
        "tree": {"top_k": list(options.tree.top_k), "max_nodes": options.tree.max_nodes},
        "draft_tokens": draft_tokens,
        "pld_tokens": pld_tokens,
        "lookup_tokens": lookup_tokens,
        "lookup_alone_ngram": lookup_alone_ngram,
        "draft_dtype": str(drafting).removeprefix("torch."),
    }
    if memory:
        generate_options = ["--model", model, "--dtype", dtype, "--threads", str(threads)]
        generate_options += ["--draft-dtype", draft_dtype]
        weights = {"--streams": streams, "--medusa": medusa, "--draft": draft, "--adapter": adapter}
        for flag, path in weights.items():
            if path is not None:
                generate_options += [flag, str(path)]
        first = questions[0].turns[0]
        for name in names:
            if name in METHODS:  # ours; the outside references have no `generate`
                stderr.print(f"peak memory: {name} in its own process")
                report["methods"][name]["peak_memory_mib"] = method_peak_memory(
                    name, first, max_new_tokens, generate_options
                )
    table = Table(title=f"{model}, {dtype}, {threads} threads, <= {max_new_tokens} new tokens")
    for column in ("method", "category", "tok/s", "speedup", "accepted/pass", "calls", "exact"):
        table.add_column(column, justify="right")
    for name, result in report["methods"].items():
        rows = [("overall", result["overall"]), *sorted(result["categories"].items())]
        for category, st in rows:
            table.add_row(
                name,
                category,
                f"{st['tokens_per_second']:.1f}",
                f"{st['speedup']:.2f}x",
                f"{st['mean_accepted']:.2f}",
                f"{st['call_reduction']:.2f}x",
                f"{st['exact_match_vs_ar']:.2f}",
            )
        table.add_section()
    Console().print(table)
    for name, where in report["divergence_summary"].items():
        stderr.print(
            f"{name}: {where['prompts']} of {len(questions)} prompts left ar's tokens; at the "
            f"first differing token the base model's logit gap was at most "
            f"{where['max_abs_logit_gap']} (median {where['median_abs_logit_gap']}; "
            f"{where['stopped_differently']} stopped instead)"
        )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")


@bench_app.command("quality")
@user_errors
def bench_quality_command(
    task: Annotated[str, typer.Option(help="dialogsum, e2e, spider or gsm8k.")],
    adapter: Annotated[
        list[Path] | None,
        typer.Option(help="Adapter to compare with the base model (repeat for several)."),
    ] = None,
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    limit: Annotated[int, typer.Option(help="Held-back test prompts.")] = 50,
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on new tokens.")] = 128,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 2,
    speed: Annotated[
        bool, typer.Option(help="Also decode with SS where streams exist (speed, exact match).")
    ] = True,
    data: Annotated[Path | None, typer.Option(help="Shared data folder.")] = None,
    json_path: JsonReport = None,
) -> None:
    """Task quality of the base model and of fine-tuned adapters, with SS speed on the task."""
    from rich.progress import Progress
    from rich.table import Table

    from edgestream.bench.environment import machine_facts
    from edgestream.bench.quality import (
        QUALITY_TASKS,
        decode_all,
        means,
        paired_difference,
        per_prompt,
        speed_stats,
    )
    from edgestream.bench.results import format_difference
    from edgestream.llm.loading import parse_dtype
    from edgestream.llm.methods import MethodOptions, make_decoder, resolve_streams
    from edgestream.llm.tasks import task_prompts

    if task not in QUALITY_TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(QUALITY_TASKS)}")
    if limit < 1 or max_new_tokens < 1:
        raise ValueError("--limit and --max-new-tokens must be at least 1")
    parse_dtype(dtype)
    for path in adapter or []:
        if not path.is_file():
            raise ValueError(f"--adapter {str(path)!r}: no such file")
    prompts = [p for p in task_prompts(task, "test", data, limit) if p.reference]
    references = [p.reference for p in prompts]
    _set_threads(threads)
    _quiet_libraries()
    rows = []
    variants: list[Path | None] = [None, *(adapter or [])]
    with Progress(console=stderr, transient=True) as bar:
        for path in variants:
            lm, streams = _load_for_decoding(model, dtype, path)
            if path is None:  # prompts the model cannot read whole are left out, visibly
                fits = [len(lm.encode_prompt(p.prompt)) < lm.context_length for p in prompts]
                if not all(fits):
                    stderr.print(
                        f"note: {fits.count(False)} prompt(s) longer than the model's context "
                        f"({lm.context_length} tokens) left out"
                    )
                    prompts = [p for p, ok in zip(prompts, fits, strict=True) if ok]
                    references = [p.reference for p in prompts]
                if not prompts:
                    raise ValueError("no test prompt fits in the model's context")
            info = {} if path is None else _adapter_info(path)
            if path is None and speed:
                try:
                    streams = resolve_streams(lm, None)[0]  # the bundled lossless streams
                except (ValueError, FileNotFoundError):
                    streams = None
            decoders = {"ar": make_decoder("ar", lm)}
            if speed and streams is not None:
                decoders["ss"] = make_decoder("ss", lm, MethodOptions(streams=streams))
            name = "base" if path is None else _variant_name(path)
            progress = bar.add_task(f"{name}: decoding", total=len(prompts))
            decoded = decode_all(
                decoders,
                lm.encode_prompt,
                lm.decode,
                prompts,
                max_new_tokens,
                lambda progress=progress: bar.advance(progress),
            )
            scores = per_prompt(task, decoded["ar"].texts, references)
            row = {
                "variant": name,
                "mode": info.get("mode", "base (zero-shot)"),
                "train_steps": info.get("train_config", {}).get("steps"),
                "train_seconds": info.get("wall_seconds"),
                **means(scores),
                "per_prompt": {metric: [round(x, 2) for x in v] for metric, v in scores.items()},
            }
            if rows:  # prompt by prompt against the variant above: is the gap more than noise?
                above = rows[-1]
                row["vs_previous"] = {
                    "variant": above["variant"],
                    **{m: paired_difference(above["per_prompt"][m], v) for m, v in scores.items()},
                }
            if "ss" in decoded:
                row.update(speed_stats(decoded["ar"], decoded["ss"]))
            # Our answers only: references stay in the data folder (their licences).
            row["examples"] = [
                {"prompt": p.key, "answer": text}
                for p, text in list(zip(prompts, decoded["ar"].texts, strict=True))[:3]
            ]
            rows.append(row)
    report = {
        "task": task,
        "model": model,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "setup": {**machine_facts(threads), "dtype": dtype, "decoding": "greedy"},
        "variants": rows,
    }
    table = Table(title=f"{task}: {len(prompts)} held-back prompts, {model}, {dtype}")
    metrics = [k for k in rows[0] if k in ("rouge1", "rougeLsum", "exact_match", "accuracy")]
    columns = ["variant", "mode", *metrics, f"{metrics[0]} vs row above, 95% CI"]
    for column in [*columns, "SS speedup", "accepted/pass", "exact"]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["variant"],
            row["mode"],
            *(f"{row[m]:.2f}" for m in metrics),
            format_difference(row.get("vs_previous", {}).get(metrics[0])),
            f"{row['speedup']:.2f}x" if "speedup" in row else "-",
            f"{row['mean_accepted']:.2f}" if "mean_accepted" in row else "-",
            f"{row['exact_match_vs_ar']:.2f}" if "exact_match_vs_ar" in row else "-",
        )
    Console().print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


@bench_app.command("results")
@user_errors
def bench_results_command(
    spec: Annotated[
        Path, typer.Option(help="`bench spec --json` report of the methods table.")
    ] = Path("docs/bench-spec-methods.json"),
    quality: Annotated[
        list[Path] | None, typer.Option(help="`bench quality --json` reports (repeatable).")
    ] = None,
    page: Annotated[Path, typer.Option(help="The results page to update.")] = Path(
        "docs/results.md"
    ),
) -> None:
    """Re-render the results page's generated tables from the benchmarks' JSON reports."""
    from edgestream.bench.results import render_quality, render_spec, update_page

    blocks = {"spec": render_spec(_read_report(spec))}
    for path in quality or sorted(page.parent.glob("bench-quality-*.json")):
        report = _read_report(path)
        blocks[f"quality-{report['task']}"] = render_quality(report)
    if not page.is_file():
        raise ValueError(f"--page {str(page)!r}: no such file")
    update_page(page, blocks)
    stderr.print(f"{page}: updated {', '.join(blocks)}")


def _read_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{str(path)!r}: no such report (run the benchmark with --json)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not a JSON report: {err}") from err


def _variant_name(path: Path) -> str:
    """An adapter's label: its run folder when the file has the default name."""
    return path.parent.name if path.name == "adapter.safetensors" else path.stem


def _adapter_info(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("info", "{}"))


def _bench_decoder(name: str, lm: object, model: str, options: object, threads: int) -> object:
    """Our methods through make_decoder; the outside references (hf-pld, llamacpp) here."""
    from edgestream.bench.spec import hf_prompt_lookup_decoder, llamacpp_decoder
    from edgestream.llm.loading import resolve_model
    from edgestream.llm.methods import make_decoder

    if name == "hf-pld":
        return hf_prompt_lookup_decoder(lm, options.pld_tokens)
    if name == "llamacpp":
        gguf = resolve_model(model)
        if gguf.suffix != ".gguf":
            raise ValueError(f"llamacpp needs a GGUF model file, not {str(gguf)!r}")
        return llamacpp_decoder(lm, gguf, threads)
    return make_decoder(name, lm, options)


DistillPrompts = Annotated[
    Path | None, typer.Option(help="Text file of prompts, one per line (instead of tasks).")
]
PromptsPerTask = Annotated[int, typer.Option(help="Distillation prompts per task.")]
DistilledLength = Annotated[int, typer.Option(help="Distilled answer length.")]
CaptureLayers = Annotated[
    int, typer.Option(help="Top layers re-run in training (>= N_s); fixes the distilled data.")
]
DraftVocab = Annotated[
    int, typer.Option(help="Draft among the N most frequent answer tokens (0: all).")
]
TrainSteps = Annotated[int, typer.Option(help="Optimizer steps.")]
TrainBatch = Annotated[int, typer.Option(help="Sequences per step (per process).")]
TrainPositions = Annotated[int, typer.Option(help="Trained positions per sequence.")]
PromptPositions = Annotated[
    int,
    typer.Option(
        help="Prompt positions trained too, per sequence (their targets are the prompt's text)."
    ),
]
Threads = Annotated[int | None, typer.Option(help="CPU threads per process.")]
DistilledFrom = Annotated[
    Path | None,
    typer.Option(
        help="Run folder whose distilled data to reuse (e.g. the streams' run, for the same "
        "data); default: distil into --out."
    ),
]


@contextlib.contextmanager
def _training_progress(
    kind: str, steps: int, rank: int, started: float
) -> Iterator[tuple[object, Callable[[int, float, list[float]], None]]]:
    """A rich progress display (rank 0 only) and the per-step report that feeds it; every 50
    steps a lasting line too, for logs."""
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr, disable=rank != 0) as bar:
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


def _train_drafter(
    kind: str,
    model: str,
    data: Path | None,
    prompts: Path | None,
    distill_dir: Path,
    prompts_per_task: int,
    max_new_tokens: int,
    capture_layers: int,
    config: object,
    threads: int | None,
    train: Callable[..., object],
) -> tuple[object, dict] | None:
    """Distil the base model's answers (resumable), then `train(base, records, captured_at,
    report)`; returns what train returned and how it was trained (None on ranks other than 0).
    Shared by the streams, the Medusa heads and the draft model, so all learn from the same
    data the same way."""
    import time

    from edgestream.llm.distill import distill, load_shards
    from edgestream.llm.loading import load_language_model
    from edgestream.llm.tasks import TaskPrompt, task_mix
    from edgestream.training import distributed_context

    if prompts is not None:
        lines = _read_prompts(prompts)
        train_prompts = [TaskPrompt("custom", str(i), line) for i, line in enumerate(lines)]
    else:
        train_prompts = task_mix("train", prompts_per_task, data)
    _set_threads(threads)
    _quiet_libraries()
    rank, world = distributed_context()
    # The frozen base runs in bfloat16 for data and training: ~2x faster here, and drafters
    # trained so serve float32 decoding equally (argmax agreement, measured in the bench).
    lm = load_language_model(model, "bfloat16")
    captured_at = lm.model.config.n_layers - capture_layers
    started = time.time()
    with _training_progress(kind, config.steps, rank, started) as (bar, report):
        task = bar.add_task("distilling", total=None, info="")
        shards = distill(
            lm,
            train_prompts,
            distill_dir / f"distill-at-{captured_at}",
            captured_at,
            max_new_tokens,
            progress=lambda i, n: bar.update(task, completed=i, total=n),
            rank=rank,
            world=world,
        )
        if world > 1:
            import torch.distributed as dist

            dist.barrier()  # every rank's shards are written
        records = load_shards(shards)
        base = load_language_model(model, "bfloat16", pack=False).model  # packed has no backward
        trained = train(base, records, captured_at, report)
    if rank != 0:
        return None
    return trained, {
        "model": model,
        "sequences": len(records),
        "processes": world,
        "train_config": config.__dict__,
        "wall_seconds": round(time.time() - started),
    }


@train_app.command("streams")
@user_errors
def train_streams_command(
    mode: Annotated[
        str,
        typer.Option(
            help="lossless (base frozen, self-distilled data); shared (LoRA + streams on --task "
            "references); lora (the baseline: LoRA, next-token loss only)."
        ),
    ] = "lossless",
    task: Annotated[
        str | None, typer.Option(help=f"shared/lora: {', '.join(SHARED_TASKS)}.")
    ] = None,
    lora_rank: Annotated[int, typer.Option(help="shared/lora: LoRA rank.")] = 16,
    init_streams: Annotated[
        Path | None,
        typer.Option(
            help="lossless/shared: start from these stream weights (e.g. the bundled ones); "
            "they set the stream configuration."
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    data: Annotated[Path | None, typer.Option(help="Shared data folder.")] = None,
    prompts: DistillPrompts = None,
    out: Annotated[Path, typer.Option(help="Run folder: distilled data, checkpoints.")] = Path(
        "runs/streams-lossless"
    ),
    export: Annotated[Path | None, typer.Option(help="Write final stream weights here.")] = None,
    prompts_per_task: PromptsPerTask = 300,
    max_new_tokens: DistilledLength = 128,
    streams: Annotated[int, typer.Option(help="gamma: speculative streams.")] = 4,
    stream_layers: Annotated[int, typer.Option(help="N_s: MSA layers at the top.")] = 4,
    capture_layers: CaptureLayers = 10,
    adapter_rank: Annotated[
        int, typer.Option(help="Stream adapter rank (0: embeddings only).")
    ] = 16,
    next_token_rank: Annotated[
        int, typer.Option(help="Rank of the next-token input map (0: off).")
    ] = 16,
    draft_vocab: DraftVocab = 8192,
    steps: TrainSteps = 2000,
    batch: TrainBatch = 4,
    positions: TrainPositions = 128,
    prompt_positions: PromptPositions = 0,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-3,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 100,
    dev_sequences: Annotated[
        int,
        typer.Option(
            help="lossless: distilled sequences held out of training (at most a tenth); the "
            "streams' top-1 accuracy on them is reported and stored with the weights."
        ),
    ] = 64,
    threads: Threads = None,
) -> None:
    """Train speculative streams: lossless (distil the base model's own answers, train the
    streams on them) or shared (fine-tune LoRA and streams together on a task)."""
    import torch

    from edgestream.llm.msa import StreamConfig, load_streams, save_streams
    from edgestream.llm.train import TrainConfig, hold_out, train_streams

    if mode not in TRAIN_MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(TRAIN_MODES)}")
    stream_config = StreamConfig(streams, stream_layers, adapter_rank, next_token_rank, draft_vocab)
    config = TrainConfig(
        steps=steps,
        batch_sequences=batch,
        positions_per_sequence=positions,
        prompt_positions_per_sequence=prompt_positions,
        lr=lr,
        warmup_steps=warmup,
    )
    if init_streams is not None and mode == "lora":
        raise ValueError("--init-streams is for --mode lossless or shared (lora has no streams)")
    if mode != "lossless":
        _train_shared_mode(
            mode,
            task,
            lora_rank,
            model,
            data,
            out,
            export,
            prompts_per_task,
            max_new_tokens,
            stream_config if mode == "shared" else None,
            config,
            threads,
            init_streams,
        )
        return
    if task is not None:
        raise ValueError("--task is for --mode shared or lora (lossless mixes every task)")
    if not stream_layers <= capture_layers:
        raise ValueError(f"--capture-layers ({capture_layers}) must be >= --stream-layers")

    def train(base: object, records: list[dict], at: int, report: object) -> tuple:
        training, held = hold_out(records, dev_sequences)
        given = None if init_streams is None else load_streams(init_streams, base, torch.float32)[0]
        trained, dev_top1 = train_streams(
            base, training, at, stream_config, config, out, model, report, given, held
        )
        return trained, dev_top1, len(held)

    result = _train_drafter(
        "stream",
        model,
        data,
        prompts,
        out,
        prompts_per_task,
        max_new_tokens,
        capture_layers,
        config,
        threads,
        train,
    )
    if result is None:
        return
    (trained, dev_top1, n_dev), info = result
    target = export or out / "streams.safetensors"
    facts = {
        "mode": mode,
        "init_streams": None if init_streams is None else str(init_streams),
        "sequences": info["sequences"] - n_dev,
        "dev_sequences": n_dev,
        "dev_top1": dev_top1 and [round(a, 4) for a in dev_top1],
    }
    save_streams(trained, target, {**info, **facts})
    if dev_top1:
        accuracy = " ".join(f"{a:.3f}" for a in dev_top1)
        stderr.print(f"held-out top-1 per stream ({n_dev} sequences): {accuracy}")
    stderr.print(f"stream weights: {target} ({trained.extra_parameters():,} parameters)")


TRAIN_MODES = ("lossless", "shared", "lora")
SHARED_TASKS = ("dialogsum", "spider", "e2e", "gsm8k", "mix")


def _train_shared_mode(
    mode: str,
    task: str | None,
    lora_rank: int,
    model: str,
    data: Path | None,
    out: Path,
    export: Path | None,
    prompts_per_task: int,
    max_answer_tokens: int,
    stream_config: object | None,
    config: object,
    threads: int | None,
    init_streams: Path | None = None,
) -> None:
    """Shared mode (LoRA + streams) or its baseline (LoRA, next-token loss) on a task."""
    import time

    from edgestream.llm.loading import load_language_model
    from edgestream.llm.lora import LoRAConfig
    from edgestream.llm.shared import save_adapter, task_records, train_shared
    from edgestream.llm.tasks import task_prompts
    from edgestream.training import distributed_context

    if task not in SHARED_TASKS:
        raise ValueError(f"--mode {mode} needs --task, one of {', '.join(SHARED_TASKS)}")
    lora_config = LoRAConfig(rank=lora_rank, alpha=2.0 * lora_rank)
    names = SHARED_TASKS[:-1] if task == "mix" else (task,)
    per_task = prompts_per_task // len(names) if task == "mix" else prompts_per_task
    prompts = [p for name in names for p in task_prompts(name, "train", data, per_task)]
    _set_threads(threads)
    _quiet_libraries()
    rank, world = distributed_context()
    lm = load_language_model(model, "bfloat16", pack=False)  # LoRA needs plain layers
    records = task_records(lm, prompts, max_answer_tokens)
    initial = None
    if init_streams is not None:
        import torch

        from edgestream.llm.msa import load_streams

        initial, _ = load_streams(init_streams, lm.model, torch.float32)
    started = time.time()
    kind = "stream (main first)" if stream_config else "token"
    with _training_progress(kind, config.steps, rank, started) as (_bar, report):
        weights = train_shared(
            lm.model, records, lora_config, stream_config, config, out, model, report, initial
        )
    if rank != 0:
        return
    info = {
        "model": model,
        "mode": mode,
        "task": task,
        "init_streams": None if init_streams is None else str(init_streams),
        "sequences": len(records),
        "processes": world,
        "train_config": config.__dict__,
        "wall_seconds": round(time.time() - started),
    }
    target = export or out / "adapter.safetensors"
    save_adapter(weights, lora_config, target, info)
    size = sum(p.numel() for p in weights.parameters() if p.requires_grad)
    stderr.print(f"adapter: {target} ({size:,} trained parameters; {mode} mode, task {task})")


@train_app.command("draft")
@user_errors
def train_draft_command(
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    data: Annotated[Path | None, typer.Option(help="Shared data folder.")] = None,
    prompts: DistillPrompts = None,
    out: Annotated[Path, typer.Option(help="Run folder: checkpoints.")] = Path("runs/draft"),
    distilled: DistilledFrom = None,
    export: Annotated[Path | None, typer.Option(help="Write final draft weights here.")] = None,
    prompts_per_task: PromptsPerTask = 300,
    max_new_tokens: DistilledLength = 128,
    layers: Annotated[int, typer.Option(help="Decoder layers of the draft model.")] = 4,
    capture_layers: CaptureLayers = 10,
    steps: TrainSteps = 2000,
    batch: TrainBatch = 4,
    positions: TrainPositions = 128,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 3e-4,
    threads: Threads = None,
) -> None:
    """Distil a small draft model (the base's first layers) for two-model speculative decoding."""
    from edgestream.llm.draft import save_draft, train_draft
    from edgestream.llm.train import TrainConfig

    config = TrainConfig(
        steps=steps, batch_sequences=batch, positions_per_sequence=positions, lr=lr
    )
    result = _train_drafter(
        "draft token",
        model,
        data,
        prompts,
        distilled or out,
        prompts_per_task,
        max_new_tokens,
        capture_layers,
        config,
        threads,
        lambda base, records, _at, report: train_draft(
            base, records, layers, config, out, model, report
        ),
    )
    if result is None:
        return
    trained, info = result
    target = export or out / "draft.safetensors"
    save_draft(trained, target, info)
    stderr.print(f"draft model: {target} ({layers} layers)")


@train_app.command("medusa")
@user_errors
def train_medusa_command(
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    data: Annotated[Path | None, typer.Option(help="Shared data folder.")] = None,
    prompts: DistillPrompts = None,
    out: Annotated[Path, typer.Option(help="Run folder: checkpoints.")] = Path("runs/medusa"),
    distilled: DistilledFrom = None,
    export: Annotated[Path | None, typer.Option(help="Write final head weights here.")] = None,
    prompts_per_task: PromptsPerTask = 300,
    max_new_tokens: DistilledLength = 128,
    heads: Annotated[int, typer.Option(help="Medusa heads (draft depth).")] = 4,
    capture_layers: CaptureLayers = 10,
    draft_vocab: DraftVocab = 8192,
    steps: TrainSteps = 2000,
    batch: TrainBatch = 4,
    positions: TrainPositions = 128,
    prompt_positions: PromptPositions = 0,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 1e-3,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 100,
    init_heads: Annotated[
        Path | None,
        typer.Option(help="Start from these trained heads (their configuration wins)."),
    ] = None,
    threads: Threads = None,
) -> None:
    """Train Medusa-1 heads (the baseline) on the same self-distilled data as the streams."""
    import torch

    from edgestream.llm.medusa import MedusaConfig, load_medusa, save_medusa, train_medusa
    from edgestream.llm.train import TrainConfig

    medusa_config = MedusaConfig(heads, draft_vocab)
    config = TrainConfig(
        steps=steps,
        batch_sequences=batch,
        positions_per_sequence=positions,
        prompt_positions_per_sequence=prompt_positions,
        lr=lr,
        warmup_steps=warmup,
    )
    result = _train_drafter(
        "head",
        model,
        data,
        prompts,
        distilled or out,
        prompts_per_task,
        max_new_tokens,
        capture_layers,
        config,
        threads,
        lambda base, records, at, report: train_medusa(
            base,
            records,
            at,
            medusa_config,
            config,
            out,
            model,
            report,
            None if init_heads is None else load_medusa(init_heads, base, torch.float32)[0],
        ),
    )
    if result is None:
        return
    trained, info = result
    target = export or out / "medusa.safetensors"
    facts = {
        "full_vocab_parameters": trained.full_vocab_parameters(),
        "init_heads": None if init_heads is None else str(init_heads),
    }
    save_medusa(trained, target, {**info, **facts})
    stderr.print(f"Medusa heads: {target} ({trained.extra_parameters():,} parameters)")


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
    with Progress(console=stderr) as bar:
        task = bar.add_task("synthesising", total=None)
        summary = synthesize_corpus(
            out,
            hours,
            data,
            seed,
            workers,
            config,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    for split, groups in summary.seconds.items():
        detail = ", ".join(f"{g} {sec / 3600:.2f} h" for g, sec in sorted(groups.items()))
        stderr.print(f"{split}: {summary.manifests[split]} ({detail})")


@asr_app.command("lm")
@user_errors
def asr_lm_command(
    out: Annotated[Path, typer.Option(help="ARPA file to write (.arpa, or .arpa.gz compressed).")],
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
    sentences = text_sentences(text) if text is not None else lm_sentences(data)
    with stderr.status(f"counting {len(sentences)} sentences"):
        lm = train_ngram(sentences, order, cutoffs)
        write_arpa(lm, out)
    stderr.print(f"wrote {out}: {lm.size} n-grams from {len(sentences)} sentences")


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
    export: Annotated[Path | None, typer.Option(help="Also copy the final model here.")] = None,
    init: Annotated[
        str | None, typer.Option(help="Start from this model ('default' or a file).")
    ] = None,
) -> None:
    """Train the streaming Conformer-CTC (also under torchrun --nproc_per_node=N)."""
    import shutil
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from edgestream.asr.conformer import ConformerConfig
    from edgestream.asr.model_io import resolve_model_path
    from edgestream.asr.train import TrainConfig, train_asr
    from edgestream.training import distributed_context

    for path in (*manifest, dev):
        if not path.is_file():
            raise FileNotFoundError(f"expected a manifest at {path}, found none")
    settings = json.loads(config.read_text("utf-8")) if config is not None else {}
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
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr, disable=rank != 0) as bar:
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
AssistRescore = Annotated[
    bool,
    typer.Option(help="Rescore the transcript's candidates with the answering model."),
]
VadOption = Annotated[
    bool,
    typer.Option(help="End segments on Silero VAD's silence instead of CTC blanks (silero-vad)."),
]


def _streaming_options(
    chunk_ms: int,
    left_chunks: int,
    beam: int | None,
    lm: str,
    vad: bool = False,
    rescore: str = "none",
) -> object:
    from edgestream.asr.lm import load_lm
    from edgestream.asr.streaming import StreamingOptions
    from edgestream.asr.vad import SileroVad

    if beam == 0:
        lm = "none"
        if rescore != "none":
            raise ValueError("--rescore needs beam search's candidates: drop --beam 0")
    language_model = load_lm(lm)
    if beam is None:
        beam = LM_BEAM if language_model is not None or rescore != "none" else 0
    options = StreamingOptions(
        chunk_ms=chunk_ms,
        left_chunks=left_chunks,
        beam=beam,
        lm=language_model,
        vad=SileroVad() if vad else None,
    )
    if rescore == "none":
        return options
    from dataclasses import replace

    from edgestream.assist.rescore import load_rescorer

    return replace(options, rescorer=load_rescorer(rescore))


def _show(table: object, report: object, json_path: Path | None) -> None:
    """Print a benchmark's table; write its report as JSON too when asked."""
    Console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1) + "\n", "utf-8")
        stderr.print(f"wrote {json_path}")


@app.command()
def transcribe(
    audio: Annotated[list[Path], typer.Argument(help="WAV, FLAC or OGG files, any rate.")],
    model: Annotated[
        str, typer.Option(help="'default' (bundled), a model file, or an exported .onnx file.")
    ] = "default",
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    chunk_ms: ChunkMs = 640,
    left_chunks: LeftChunks = 4,
    beam: Beam = None,
    lm: LmName = "default",
    rescore: Rescore = "none",
    vad: VadOption = False,
    stream: Annotated[bool, typer.Option(help="Print partial results as they come.")] = False,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="JSON Lines output.")] = False,
) -> None:
    """Transcribe audio files with the streaming Conformer-CTC recognizer.

    rtf = processing seconds / audio seconds; first_partial_ms = when the first words would
    have appeared, had the audio arrived live."""
    from edgestream.asr.backends import load_streaming_model, resolve_backend
    from edgestream.asr.transcribe import transcribe_file

    try:
        if threads is not None and threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        if resolve_backend(model, backend) != "onnx":  # onnxruntime takes them per session
            _set_threads(threads)
        asr = load_streaming_model(model, backend, threads)  # a bad model fails before an LLM loads
        options = _streaming_options(chunk_ms, left_chunks, beam, lm, vad, rescore)
        asr.chunk_encoder(options.left_chunks * options.chunk_frames)  # settings it can run
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        raise typer.Exit(2) from None
    failed = False
    for path in audio:  # a bad file is reported and skipped; the others are still transcribed

        def show(partial: str, path: Path = path) -> None:
            if json_output:
                print(json.dumps({"audio": str(path), "partial": partial}), flush=True)
            else:
                sys.stderr.write(f"\r\x1b[K{partial[-150:]}")
                sys.stderr.flush()

        try:
            result = transcribe_file(asr, path, options, show if stream else None)
        except (ValueError, FileNotFoundError) as err:
            print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
            failed = True
            continue
        if stream and not json_output:
            sys.stderr.write("\r\x1b[K")
        for warning in result.warnings:
            print(f"warning: {path}: {warning}", file=sys.stderr)
        if json_output:
            print(json.dumps(result.to_json()), flush=True)
        else:
            print(f"{path}: {result.text}" if len(audio) > 1 else result.text, flush=True)
    if failed:
        raise typer.Exit(2)


@bench_app.command("asr")
@user_errors
def bench_asr_command(
    manifest: Annotated[
        Path,
        typer.Option(
            help="JSON Lines: audio, text, optional group; `real-speech`: the bundled recordings."
        ),
    ],
    model: AsrModelName = "default",
    chunk_ms: ChunkMs = 640,
    left_chunks: LeftChunks = 4,
    beam: Beam = None,
    lm: LmName = "default",
    rescore: Rescore = "none",
    vad: VadOption = False,
    limit: Annotated[int | None, typer.Option(help="At most this many utterances.")] = None,
    pocketsphinx: Annotated[bool, typer.Option(help="Also run pocketsphinx.")] = True,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    json_path: JsonReport = None,
    hypotheses: Annotated[
        Path | None,
        typer.Option(help="Also write each utterance's reference and hypothesis (JSON Lines)."),
    ] = None,
) -> None:
    """WER, CER and real-time factor (1 and 2 threads) per group, next to pocketsphinx."""
    from rich.progress import Progress
    from rich.table import Table

    from edgestream.asr.backends import load_streaming_model
    from edgestream.bench.asr import bench_asr, read_bench_manifest

    utterances = read_bench_manifest(manifest, limit)
    options = _streaming_options(chunk_ms, left_chunks, beam, lm, vad, rescore)
    for output in (json_path, hypotheses):  # fail now, not after the whole run
        if output is not None and not output.parent.is_dir():
            raise FileNotFoundError(f"no folder {output.parent} to write {output.name} into")
    load_streaming_model(model, backend).chunk_encoder(  # bad model or settings: fail now
        options.left_chunks * options.chunk_frames
    )
    with Progress(console=stderr, transient=True) as bar:
        tasks: dict[str, object] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        report = bench_asr(model, utterances, options, pocketsphinx, progress, backend, hypotheses)
    title = f"ASR on {manifest} ({report['backend']}, {report['decoder']}, {chunk_ms} ms chunks)"
    table = Table(title=title)
    columns = ("system", "group", "utterances", "audio s", "WER", "CER", "RTF 1 thread", "RTF 2")
    for column in columns:
        table.add_column(column)
    systems = [("edgestream", report)]
    if "overall" in report["pocketsphinx"]:
        systems.append(("pocketsphinx", report["pocketsphinx"]))
    for system, rows in systems:
        for group, row in [("overall", rows["overall"]), *rows["groups"].items()]:
            table.add_row(
                system,
                group,
                str(row["utterances"]),
                f"{row['audio_seconds']:.0f}",
                f"{row['wer']:.2%}",
                f"{row['cer']:.2%}",
                f"{row['rtf']:.4f}",
                f"{row['rtf_2threads']:.4f}" if "rtf_2threads" in row else "-",
            )
    _show(table, report, json_path)


@bench_app.command("backends")
@user_errors
def bench_backends_command(
    manifest: Annotated[Path, typer.Option(help="JSON Lines: audio, text, optional group.")],
    model: AsrModelName = "default",
    chunk_ms: ChunkMs = 640,
    left_chunks: LeftChunks = 4,
    limit: Annotated[int | None, typer.Option(help="At most this many utterances.")] = None,
    backends: Annotated[
        str, typer.Option(help="Comma-separated: torch, accelerator, onnx-float32/16, onnx-int8.")
    ] = "torch,accelerator,onnx-float32,onnx-float16,onnx-int8",
    json_path: JsonReport = None,
) -> None:
    """WER, RTF (1 and 2 threads) and peak memory of every backend, each in its own process."""
    from rich.table import Table

    from edgestream.bench.backends import bench_backends

    options = _streaming_options(chunk_ms, left_chunks, 0, "none")
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    if not manifest.is_file():
        raise FileNotFoundError(f"no such manifest: {manifest}")
    with stderr.status("benchmarking") as status:
        report = bench_backends(
            manifest, model, options, limit, chosen, lambda stage: status.update(stage)
        )
    table = Table(title=f"ASR backends on {manifest} ({chunk_ms} ms chunks)")
    for column in ("backend", "WER", "vs torch", "RTF 1 thread", "RTF 2", "peak MiB"):
        table.add_column(column)
    for name, row in report["backends"].items():
        table.add_row(
            name,
            f"{row['wer']:.2%}",
            f"{row['wer_vs_torch']:+.2%}" if "wer_vs_torch" in row else "-",
            f"{row['rtf']:.4f}",
            f"{row['rtf_2threads']:.4f}",
            f"{row['peak_mib']:.0f}",
        )
    _show(table, report, json_path)


@bench_app.command("subsampling")
@user_errors
def bench_subsampling_command(
    model: Annotated[
        str, typer.Option(help="Model whose shape to use ('default' or a file).")
    ] = "default",
    chunk_ms: ChunkMs = 640,
    json_path: JsonReport = None,
) -> None:
    """Share of compute and latency in the subsampling: depthwise separable vs Conv2d."""
    from rich.table import Table

    from edgestream.asr.model_io import load_model
    from edgestream.bench.subsampling import subsampling_share

    options = _streaming_options(chunk_ms, 4, 0, "none")
    results = subsampling_share(load_model(model).model.config, options.chunk_frames)
    table = Table(title=f"Subsampling share of a {chunk_ms} ms streaming step (1 thread)")
    for column in ("subsampling", "params", "MFLOPs", "FLOPs share", "ms", "latency share"):
        table.add_column(column)
    for kind, row in results.items():
        table.add_row(
            kind,
            f"{row['subsampling_parameters']:,}",
            f"{row['subsampling_mflops']:.1f} / {row['chunk_mflops']:.1f}",
            f"{row['flops_share']:.1%}",
            f"{row['subsampling_ms']:.2f} / {row['chunk_ms']:.2f}",
            f"{row['latency_share']:.1%}",
        )
    _show(table, results, json_path)


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
    from edgestream.asr.export import export_onnx, max_step_difference
    from edgestream.asr.model_io import load_model

    options = _streaming_options(chunk_ms, left_chunks, 0, "none")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    asr = load_model(model)
    if format_ == "coreml":
        from edgestream.asr.coreml import export_coreml

        if int8:
            raise ValueError("--int8 is for ONNX; Core ML takes --fp16")
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


@numerics_app.command("report")
@user_errors
def numerics_report_command(
    json_path: JsonReport = None,
    seed: Annotated[int, typer.Option(help="Seed of the adversarial suite.")] = 0,
) -> None:
    """Overflow rate and relative error per format and pre-normalizer on adversarial inputs."""
    from edgestream.numerics.report import numerics_report, report_table

    report = numerics_report(seed=seed)
    Console().print(report_table(report))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")


@app.command()
@user_errors
def assist(
    audio: Annotated[Path, typer.Argument(help="A spoken question: WAV, FLAC or OGG, any rate.")],
    method: Annotated[str, typer.Option(help="Answer decoding: ss or ar.")] = "ss",
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for --method ss (default: bundled).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on answer tokens.")] = 128,
    chunk_ms: ChunkMs = 640,
    lm: LmName = "default",
    rescore: AssistRescore = True,
    compare: Annotated[
        bool, typer.Option(help="Also decode the answer with ar: speedup and exact match.")
    ] = True,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Transcribe a spoken question as a stream, then answer it with the language model."""
    from edgestream.assist.pipeline import ANSWER_METHODS, Assistant, AssistantConfig

    if method not in ANSWER_METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(ANSWER_METHODS)}")
    if not audio.is_file():
        raise FileNotFoundError(f"no such audio file: {audio}")
    _set_threads(threads)
    _quiet_libraries()
    config = AssistantConfig(
        asr_model=asr_model,
        llm=llm,
        streams_path=streams,
        streaming=_streaming_options(chunk_ms, 4, None, lm),
        max_new_tokens=max_new_tokens,
        rescore=rescore,
    )
    assistant = Assistant.load(config)

    shown: list[str] = []

    def show_partial(text: str) -> None:
        sys.stderr.write(f"\r\x1b[K{text[-150:]}")
        sys.stderr.flush()
        shown.append(text)

    transcript = assistant.transcribe(audio, None if json_output else show_partial)
    if shown:  # clear the partial line before anything else is printed
        sys.stderr.write("\r\x1b[K")
    if not transcript.text.strip():
        raise ValueError(f"no speech recognised in {audio}")
    streamer = None if json_output else _TextStreamer(assistant.lm.decode)
    if streamer is not None:
        print(f"you: {transcript.text}", flush=True)
        sys.stdout.write("assistant: ")
    answer = assistant.answer(transcript.text, method, streamer, compare=compare)
    if json_output:
        record = {"transcript": transcript.to_json(), "answer": answer.to_json()}
        print(json.dumps(record, ensure_ascii=False))
        return
    assert streamer is not None
    sys.stdout.write(answer.text[streamer.printed :] + "\n")
    result = answer.result
    stderr.print(
        f"[dim]speech: {transcript.duration:.1f} s at RTF {transcript.rtf:.3f}; answer: "
        f"{result.new_tokens} tokens, {result.tokens_per_second:.1f} tokens/s, "
        f"{result.mean_accepted:.2f} tokens/pass ({method})[/dim]"
    )
    if answer.baseline is not None:
        same = "identical" if answer.identical_to_ar else "DIFFERENT"
        stderr.print(
            f"[bold]ar {answer.baseline.tokens_per_second:.1f} tokens/s, {method} "
            f"{result.tokens_per_second:.1f} tokens/s: {answer.speedup:.2f}x, output {same}[/bold]"
        )


@app.command()
@user_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="EDGESTREAM_TOKEN",
            help="Require this bearer token on every endpoint (or set EDGESTREAM_TOKEN).",
        ),
    ] = None,
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for ss (default: bundled).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Default upper bound on answers.")] = 128,
    max_streams: Annotated[int, typer.Option(help="Concurrent audio streams allowed.")] = 16,
    lm: LmName = "default",
    rescore: AssistRescore = True,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
) -> None:
    """Serve the voice assistant: a web page, streaming transcription and answers."""
    from edgestream.assist.pipeline import Assistant, AssistantConfig
    from edgestream.serve.app import ServerSettings, run_server

    if not 0 < port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {port}")
    if token is not None and not token.strip():
        raise ValueError("--token is empty")
    if max_streams < 1:
        raise ValueError(f"--max-streams must be at least 1, got {max_streams}")

    _set_threads(threads)
    _quiet_libraries()
    config = AssistantConfig(
        asr_model=asr_model,
        llm=llm,
        streams_path=streams,
        streaming=_streaming_options(640, 4, None, lm),
        max_new_tokens=max_new_tokens,
        rescore=rescore,
    )
    assistant = Assistant.load(config)
    methods = assistant.methods()  # loads the stream weights now, not on the first request
    settings = ServerSettings(token=token, max_streams=max_streams)
    page = f"http://{host}:{port}/" + ("?token=YOUR_TOKEN" if token else "")
    stderr.print(f"answers with {', '.join(methods)}; open {page}")
    if host not in ("127.0.0.1", "localhost", "::1") and token is None:
        stderr.print("[bold]warning: listening beyond loopback without --token[/bold]")
    run_server(assistant, settings, host, port)


@numerics_app.command("activations")
@user_errors
def numerics_activations_command(
    audio: Annotated[
        list[Path] | None, typer.Option(help="Speech for the Conformer (default: the sample).")
    ] = None,
    asr_model: Annotated[str, typer.Option(help="'default' or an ASR model file.")] = "default",
    llm: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per float16 decode.")] = 32,
    json_path: JsonReport = None,
) -> None:
    """Norms on real activations (Conformer, SmolLM2) and SmolLM2 decoded in float16."""
    from rich.table import Table

    from edgestream.asr.model_io import load_model
    from edgestream.bench.activations import activations_study
    from edgestream.bench.generate import DEFAULT_PROMPTS
    from edgestream.llm.loading import load_language_model
    from edgestream.numerics.report import report_table

    sample = Path(__file__).parent / "asr/samples/why-is-the-sky-blue.wav"
    paths = [str(p) for p in (audio or [sample])]
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such audio file: {path}")
    _quiet_libraries()
    with stderr.status("capturing activations and decoding in float16"):
        study = activations_study(
            load_model(asr_model),
            load_language_model(llm, pack=False),
            paths,
            list(DEFAULT_PROMPTS),
            max_new_tokens,
        )
    console = Console()
    console.print(report_table(study))
    console.print(
        "largest |x| entering a norm: "
        + ", ".join(f"{k} {v:g}" for k, v in study["largest"].items())
    )
    table = Table(title=f"{llm} in float16, greedy, vs float32 ({max_new_tokens} tokens)")
    for column in ("RMSNorm", "identical outputs", "agreeing prefix", "non-finite logits"):
        table.add_column(column)
    for variant, row in study["float16_decoding"].items():
        table.add_row(
            variant,
            f"{row['identical_outputs']}/{row['prompts']}",
            f"{row['mean_agreeing_prefix']:.0%}",
            str(row["nonfinite_prefill_logits"]),
        )
    _show(table, study, json_path)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
