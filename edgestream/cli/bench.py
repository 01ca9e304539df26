"""`edgestream bench ...`: every benchmark, each printing ratios against a baseline measured
alongside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from edgestream.cli.common import (
    BACKEND_HELP,
    BENCH_METHODS,
    METHODS,
    PRECISION_HELP,
    AdapterPath,
    AsrModelName,
    Beam,
    ChunkMs,
    ContextDrafts,
    DraftDtype,
    DraftModelPath,
    EndpointSilence,
    JsonReport,
    LeftChunks,
    LmName,
    MedusaHeadsPath,
    Rescore,
    RescoreAdapter,
    TreeMinProb,
    TreeNodes,
    TreeTopK,
    VadOption,
    bench_app,
    check_baseline_weights,
    load_for_decoding,
    quiet_libraries,
    read_prompts,
    set_threads,
    show_report,
    stderr,
    streaming_options,
    tree_shape,
    user_errors,
    writable_file,
    write_report,
)

if TYPE_CHECKING:
    from edgestream.llm.tree import TreeShape


@bench_app.command("generate")
@user_errors
def bench_generate_command(
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    dtypes: Annotated[
        str,
        typer.Option(
            help="Comma-separated precisions: float32, bfloat16, q4_1 (transformers runs "
            "q4_1's rows in float32, having no 4-bit CPU path)."
        ),
    ] = "float32,bfloat16",
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
    from edgestream.llm.loading import parse_precision

    dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
    for d in dtype_list:
        parse_precision(d)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    prompt_list = read_prompts(prompts)
    quiet_libraries()
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
            r["dtype"]
            if r["dtype"] == r["transformers_dtype"]
            else f"{r['dtype']} (transformers {r['transformers_dtype']})",
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
    write_report(report, json_path)


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
    suite: Annotated[
        str | None,
        typer.Option(
            help="'tasks': held-back test prompts of every task; 'chat-probe': held-back chat "
            "requests, coding requests and context-free questions."
        ),
    ] = None,
    methods: Annotated[
        str, typer.Option(help="Comma-separated methods; ar is always run.")
    ] = "ar,ss",
    model: Annotated[str, typer.Option(help="Model name (smollm2) or local path.")] = "smollm2",
    max_new_tokens: Annotated[int, typer.Option(help="Upper bound on new tokens per turn.")] = 128,
    limit: Annotated[
        int, typer.Option(help="Prompts per category or kind (suite) or in all (file).")
    ] = 10,
    dtype: Annotated[str, typer.Option(help=PRECISION_HELP)] = "float32",
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
    tree_nodes: TreeNodes = None,
    tree_top_k: TreeTopK = None,
    tree_min_prob: TreeMinProb = 0.0,
    context_drafts: ContextDrafts = True,
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
    data: Annotated[Path | None, typer.Option(help="Shared data folder (for --suite).")] = None,
    json_path: JsonReport = None,
) -> None:
    """Speculative decoding methods vs AR: speedup, accepted tokens, exact match, per category."""
    from rich.progress import Progress

    from edgestream.bench.environment import peak_rss_mib
    from edgestream.bench.spec import (
        LLAMACPP_INSTALL,
        REFERENCE_METHODS,
        SUITES,
        bench_spec,
        llamacpp_available,
        read_spec_prompts,
    )
    from edgestream.llm.engine import Sampling
    from edgestream.llm.loading import parse_precision
    from edgestream.llm.methods import (
        MethodOptions,
        draft_dtype_name,
        drafting_dtype,
        footprint,
    )

    names = _split_methods(methods)
    check_baseline_weights(names, medusa, draft)
    drafting = drafting_dtype(draft_dtype, parse_precision(dtype))
    tree = tree_shape(tree_nodes, tree_top_k, tree_min_prob)
    if (prompts is None) == (suite is None):
        raise ValueError(f"give exactly one of --prompts FILE or --suite {{{','.join(SUITES)}}}")
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: expected one of {', '.join(SUITES)}")
    if limit < 1 or max_new_tokens < 1:
        raise ValueError("--limit and --max-new-tokens must be at least 1")
    questions = read_spec_prompts(prompts)[:limit] if prompts else SUITES[suite](limit, data)
    _check_draft_lengths(pld_tokens, lookup_tokens, draft_tokens, lookup_alone_ngram)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    if not sampling.greedy and any(m in REFERENCE_METHODS for m in names):
        raise ValueError("the outside references (hf-pld, llamacpp) are measured greedy only")
    set_threads(threads)
    quiet_libraries()
    lm, adapter_streams = load_for_decoding(model, dtype, adapter)
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
        tree=tree,
        context_drafts=context_drafts,
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
        "tree": {
            "top_k": list(options.tree.top_k),
            "max_nodes": options.tree.max_nodes,
            "min_path_prob": options.tree.min_path_prob,
        },
        "draft_tokens": draft_tokens,
        "pld_tokens": pld_tokens,
        "lookup_tokens": lookup_tokens,
        "lookup_alone_ngram": lookup_alone_ngram,
        "draft_dtype": draft_dtype_name(drafting),
        "context_drafts": context_drafts,
    }
    if memory:
        weights = {"--streams": streams, "--medusa": medusa, "--draft": draft, "--adapter": adapter}
        generate_options = _generate_options(
            model, dtype, threads, draft_dtype, tree, context_drafts, weights
        )
        _measure_peak_memory(report, names, questions[0].turns[0], max_new_tokens, generate_options)
    title = f"{model}, {dtype}, {threads} threads, <= {max_new_tokens} new tokens"
    Console().print(_spec_table(report, title))
    for name, where in report["divergence_summary"].items():
        stderr.print(
            f"{name}: {where['prompts']} of {len(questions)} prompts left ar's tokens; at the "
            f"first differing token the base model's logit gap was at most "
            f"{where['max_abs_logit_gap']} (median {where['median_abs_logit_gap']}; "
            f"{where['stopped_differently']} stopped instead)"
        )
    write_report(report, json_path)


def _check_draft_lengths(
    pld_tokens: int, lookup_tokens: int, draft_tokens: int, lookup_alone_ngram: int
) -> None:
    from edgestream.llm.methods import MethodOptions

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


def _generate_options(
    model: str,
    dtype: str,
    threads: int,
    draft_dtype: str,
    tree: TreeShape,
    context_drafts: bool,
    weights: dict[str, Path | None],
) -> list[str]:
    """`edgestream generate` options that decode as this benchmark does."""
    options = ["--model", model, "--dtype", dtype, "--threads", str(threads)]
    options += ["--draft-dtype", draft_dtype, "--tree-nodes", str(tree.max_nodes)]
    options += ["--tree-top-k", ",".join(map(str, tree.top_k))]
    options += ["--tree-min-prob", str(tree.min_path_prob)]
    options += ["--context-drafts" if context_drafts else "--no-context-drafts"]
    for flag, path in weights.items():
        if path is not None:
            options += [flag, str(path)]
    return options


def _measure_peak_memory(
    report: dict, names: list[str], prompt: str, max_new_tokens: int, generate_options: list[str]
) -> None:
    """Each of our methods' peak memory, in a process of its own (the outside references have
    no `generate`)."""
    from edgestream.bench.spec import method_peak_memory
    from edgestream.llm.methods import METHODS

    for name in names:
        if name in METHODS:
            stderr.print(f"peak memory: {name} in its own process")
            report["methods"][name]["peak_memory_mib"] = method_peak_memory(
                name, prompt, max_new_tokens, generate_options
            )


def _spec_table(report: dict, title: str) -> object:
    """Every method's overall and per-category row of a `bench spec` report."""
    from rich.table import Table

    table = Table(title=title)
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
    return table


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
    dtype: Annotated[str, typer.Option(help=PRECISION_HELP)] = "float32",
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
    from edgestream.llm.loading import parse_precision
    from edgestream.llm.methods import MethodOptions, make_decoder, resolve_streams
    from edgestream.llm.tasks import task_prompts

    if task not in QUALITY_TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(QUALITY_TASKS)}")
    if limit < 1 or max_new_tokens < 1:
        raise ValueError("--limit and --max-new-tokens must be at least 1")
    parse_precision(dtype)
    for path in adapter or []:
        if not path.is_file():
            raise ValueError(f"--adapter {str(path)!r}: no such file")
    prompts = [p for p in task_prompts(task, "test", data, limit) if p.reference]
    references = [p.reference for p in prompts]
    set_threads(threads)
    quiet_libraries()
    rows = []
    variants: list[Path | None] = [None, *(adapter or [])]
    with Progress(console=stderr, transient=True) as bar:
        for path in variants:
            lm, streams = load_for_decoding(model, dtype, path)
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
    show_report(table, report, json_path)


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
    rescore_adapter: RescoreAdapter = "default",
    vad: VadOption = False,
    endpoint_silence: EndpointSilence = None,
    limit: Annotated[int | None, typer.Option(help="At most this many utterances.")] = None,
    pocketsphinx: Annotated[bool, typer.Option(help="Also run pocketsphinx.")] = True,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    json_path: JsonReport = None,
    hypotheses: Annotated[
        Path | None,
        typer.Option(
            help="Also write each utterance's reference and hypothesis (JSON Lines).",
            callback=writable_file("--hypotheses"),
        ),
    ] = None,
    continuous: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Score continuous speech instead: each group's utterances as streams of eight, "
            "this many seconds of silence apart (pocketsphinx is not run).",
        ),
    ] = None,
) -> None:
    """WER, CER and real-time factor (1 and 2 threads) per group, next to pocketsphinx."""
    from rich.progress import Progress
    from rich.table import Table

    from edgestream.asr.backends import load_streaming_model
    from edgestream.bench.asr import bench_asr, read_bench_manifest

    utterances = read_bench_manifest(manifest, limit)
    options = streaming_options(
        chunk_ms, left_chunks, beam, lm, vad, rescore, rescore_adapter, endpoint_silence
    )
    load_streaming_model(model, backend).chunk_encoder(  # bad model or settings: fail now
        options.left_chunks * options.chunk_frames
    )
    with Progress(console=stderr, transient=True) as bar:
        tasks: dict[str, object] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        report = bench_asr(
            model, utterances, options, pocketsphinx, progress, backend, hypotheses, continuous
        )
    title = f"ASR on {manifest} ({report['backend']}, {report['decoder']}, {chunk_ms} ms chunks)"
    if continuous is not None:
        title += f", streams of 8 utterances {continuous:g} s apart"
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
    show_report(table, report, json_path)


@bench_app.command("asr-compare")
@user_errors
def bench_asr_compare_command(
    before: Annotated[Path, typer.Argument(help="`bench asr --hypotheses` of the old model.")],
    after: Annotated[Path, typer.Argument(help="The same, of the new model, same manifest.")],
    rounds: Annotated[int, typer.Option(min=100, help="Bootstrap resamples.")] = 10_000,
    json_path: JsonReport = None,
) -> None:
    """WER after - before with a 95% paired bootstrap interval over utterances, per group."""
    from rich.table import Table

    from edgestream.bench.asr_compare import compare_runs, read_hypotheses

    report = compare_runs(read_hypotheses(before), read_hypotheses(after), rounds)
    table = Table(title=f"WER, {after} against {before} (paired bootstrap, 95%)")
    for column in ("group", "utterances", "before", "after", "after - before", "better / worse"):
        table.add_column(column)
    for group, row in [("overall", report["overall"]), *report["groups"].items()]:
        table.add_row(
            group,
            str(row["utterances"]),
            f"{row['wer_before']:.2f}%",
            f"{row['wer_after']:.2f}%",
            f"{row['difference']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}]",
            f"{row['better']} / {row['worse']}",
        )
    show_report(table, report, json_path)


@bench_app.command("live")
@user_errors
def bench_live_command(
    manifest: Annotated[Path, typer.Option(help="JSON Lines: audio, text, optional group.")],
    model: AsrModelName = "default",
    limit: Annotated[int, typer.Option(min=1, help="Utterances, evenly spaced.")] = 8,
    pause: Annotated[float, typer.Option(help="Seconds of silence after each utterance.")] = 2.0,
    chunk_ms: ChunkMs = 640,
    threads: Annotated[int, typer.Option(min=1, help="The recognizer's CPU threads.")] = 1,
    endpoint_silence: EndpointSilence = None,
    assist_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Play into `assist -` instead, answers of at most this many tokens, and time "
            "when each answer's text begins (leave --pause room for the answer).",
        ),
    ] = None,
    json_path: JsonReport = None,
) -> None:
    """Delays of live transcription: utterances played at real time into `transcribe -`."""
    from rich.table import Table

    from edgestream.bench.asr import read_bench_manifest
    from edgestream.bench.live import measure_live

    utterances = read_bench_manifest(manifest, limit)
    seconds = sum(u.audio.stat().st_size for u in utterances) / 32_000 + limit * pause
    with stderr.status(f"playing about {seconds + 5:.0f} s of audio at real time"):
        report = measure_live(
            utterances, model, threads, pause, endpoint_silence, assist_tokens, chunk_ms
        )
    table = Table(
        title=f"Live transcription of {manifest} through a pipe ({chunk_ms} ms chunks, "
        f"{threads} thread(s))"
    )
    for column in ("delay", "mean s", "median s", "max s", "utterances"):
        table.add_column(column)
    rows = (
        ("segment printed, after the speech ends", "segment_delay_s"),
        ("first words shown, after it starts", "first_words_s"),
        ("answer begins, after the speech ends", "answer_delay_s"),
        ("segment's start time minus the speech's", "start_offset_s"),
        ("segment's end time minus the speech's", "end_offset_s"),
    )
    for name, key in rows:
        row = report[key]
        if row is not None:
            numbers = (f"{row[k]:.2f}" for k in ("mean", "median", "max"))
            table.add_row(name, *numbers, str(row["count"]))
    rtf = "" if report["rtf"] is None else f"; RTF {report['rtf']:.3f}"
    table.caption = (
        f"{report['segments']} segments for {report['utterances']} utterances; "
        f"WER {report['wer']:.2%}{rtf}"
    )
    show_report(table, report, json_path)


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

    options = streaming_options(chunk_ms, left_chunks, 0, "none")
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
    show_report(table, report, json_path)


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

    options = streaming_options(chunk_ms, 4, 0, "none")
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
    show_report(table, results, json_path)
