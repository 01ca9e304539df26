"""Language-model commands: `generate`, and `train streams|draft|medusa`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from edgestream.cli.common import (
    METHODS,
    PRECISION_HELP,
    AdapterPath,
    ContextDrafts,
    DraftDtype,
    DraftModelPath,
    MedusaHeadsPath,
    TextStreamer,
    TreeMinProb,
    TreeNodes,
    TreeTopK,
    app,
    check_baseline_weights,
    load_for_decoding,
    quiet_libraries,
    read_prompts,
    set_threads,
    stderr,
    train_app,
    training_progress,
    tree_shape,
    user_errors,
    writable_file,
)


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
    dtype: Annotated[str, typer.Option(help=PRECISION_HELP)] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: PyTorch's).")] = None,
    streams: Annotated[
        Path | None, typer.Option(help="Stream weights for --method ss (default: bundled).")
    ] = None,
    medusa: MedusaHeadsPath = None,
    draft: DraftModelPath = None,
    adapter: AdapterPath = None,
    draft_dtype: DraftDtype = "auto",
    tree_nodes: TreeNodes = None,
    tree_top_k: TreeTopK = None,
    tree_min_prob: TreeMinProb = 0.0,
    context_drafts: ContextDrafts = True,
    compare: Annotated[
        bool, typer.Option(help="Also decode with ar and report the speedup and exact match.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a reply to PROMPT and report its speed."""
    from edgestream.bench.environment import peak_rss_mib
    from edgestream.llm.engine import Sampling
    from edgestream.llm.loading import parse_precision
    from edgestream.llm.methods import MethodOptions, drafting_dtype, make_decoder

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    check_baseline_weights([method], medusa, draft)
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    drafting_dtype(draft_dtype, parse_precision(dtype))
    tree = tree_shape(tree_nodes, tree_top_k, tree_min_prob)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    set_threads(threads)
    quiet_libraries()

    lm, adapter_streams = load_for_decoding(model, dtype, adapter)
    options = MethodOptions(
        sampling=sampling,
        streams_path=streams,
        streams=adapter_streams,
        medusa_path=medusa,
        draft_path=draft,
        draft_dtype=draft_dtype,
        tree=tree,
        context_drafts=context_drafts,
    )
    decode = make_decoder(method, lm, options)
    prompt_ids = lm.encode_prompt(prompt, chat)
    streamer = None if json_output else TextStreamer(lm.decode)
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


DistillPrompts = Annotated[
    Path | None, typer.Option(help="Text file of prompts, one per line (instead of tasks).")
]


PromptsPerTask = Annotated[int, typer.Option(help="Distillation prompts per task.")]


SkipPerTask = Annotated[
    int,
    typer.Option(
        help="Skip each task's first N prompts (e.g. those the bundled streams were trained on)."
    ),
]


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


ReplayRuns = Annotated[
    list[Path] | None,
    typer.Option(
        "--replay",
        help="An earlier run folder whose distilled answers train too (repeatable), e.g. so "
        "new data does not pull the drafter away from the old; same --capture-layers.",
    ),
]


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
    skip_per_task: int = 0,
    replay: Sequence[Path] = (),
) -> tuple[object, dict] | None:
    """Distil the base model's answers (resumable), then `train(base, records, replayed,
    captured_at, report)`, where `replayed` are the answers distilled by the earlier runs in
    `replay`; returns what train returned and how it was trained (None on ranks other than 0).
    Shared by the streams, the Medusa heads and the draft model, so all learn from the same
    data the same way."""
    import time

    from edgestream.llm.distill import distill, load_shards, shards_in
    from edgestream.llm.loading import load_language_model, training_dtype
    from edgestream.llm.tasks import TaskPrompt, task_mix
    from edgestream.training import distributed_context

    if prompts is not None:
        lines = read_prompts(prompts)
        train_prompts = [TaskPrompt("custom", str(i), line) for i, line in enumerate(lines)]
    else:
        train_prompts = task_mix("train", prompts_per_task, data, skip_per_task)
    set_threads(threads)
    quiet_libraries()
    rank, world = distributed_context()
    # The frozen base runs in bfloat16 for data and training where the CPU has it natively
    # (~2x faster), and drafters trained so serve float32 decoding equally (argmax
    # agreement, measured in the bench); elsewhere in float32 (`training_dtype`).
    lm = load_language_model(model, training_dtype())
    captured_at = lm.model.config.n_layers - capture_layers
    # Checked before distilling, which may take long: a wrong folder fails at once.
    replay_shards = {s.name: s for run in replay for s in shards_in(run, captured_at)}
    started = time.time()
    with training_progress(kind, config.steps, rank, started) as (bar, report):
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
        # A shard this run distilled itself is not replayed twice.
        own = {s.name for s in shards}
        replayed = load_shards([s for name, s in replay_shards.items() if name not in own])
        # Unpacked: packed weights have no backward.
        base = load_language_model(model, training_dtype(), pack=False).model
        trained = train(base, records, replayed, captured_at, report)
    if rank != 0:
        return None
    return trained, {
        "model": model,
        "sequences": len(records) + len(replayed),
        "replayed": [str(run) for run in replay],
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
    export: Annotated[
        Path | None,
        typer.Option(help="Write final stream weights here.", callback=writable_file("--export")),
    ] = None,
    replay: ReplayRuns = None,
    prompts_per_task: PromptsPerTask = 300,
    skip_per_task: SkipPerTask = 0,
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
    ffn_rank: Annotated[
        int,
        typer.Option(
            help="Rank of stream-only feed-forward adapters (0: none). With --init-streams "
            "that have none, they are added at zero, so training continues from those drafts."
        ),
    ] = 0,
    steps: TrainSteps = 2000,
    batch: TrainBatch = 4,
    positions: TrainPositions = 128,
    prompt_positions: PromptPositions = 0,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-3,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 100,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the new weights (LoRA, fresh streams) and of the batch draws: rerun "
            "with others to see how much of a difference is the run's luck."
        ),
    ] = 0,
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
    stream_config = StreamConfig(
        streams, stream_layers, adapter_rank, next_token_rank, draft_vocab, ffn_rank
    )
    config = TrainConfig(
        steps=steps,
        batch_sequences=batch,
        positions_per_sequence=positions,
        prompt_positions_per_sequence=prompt_positions,
        lr=lr,
        warmup_steps=warmup,
        seed=seed,
    )
    if init_streams is not None and mode == "lora":
        raise ValueError("--init-streams is for --mode lossless or shared (lora has no streams)")
    if replay and mode != "lossless":
        raise ValueError("--replay is for --mode lossless (shared and lora train on --task data)")
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

    def train(
        base: object, records: list[dict], replayed: list[dict], at: int, report: object
    ) -> tuple:
        training, held = hold_out(records, dev_sequences, replayed)
        given = None if init_streams is None else load_streams(init_streams, base, torch.float32)[0]
        trained, dev_top1 = train_streams(
            base, training, at, stream_config, config, out, model, report, given, held
        )
        return trained, dev_top1, len(held), len(training)

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
        skip_per_task,
        replay=replay or (),
    )
    if result is None:
        return
    (trained, dev_top1, n_dev, n_train), info = result
    target = export or out / "streams.safetensors"
    facts = {
        "mode": mode,
        "init_streams": None if init_streams is None else str(init_streams),
        "prompts": str(prompts)
        if prompts is not None
        else (f"task mix, {prompts_per_task} per task after the first {skip_per_task}"),
        "sequences": n_train,
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

    from edgestream.llm.loading import load_language_model, training_dtype
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
    set_threads(threads)
    quiet_libraries()
    rank, world = distributed_context()
    lm = load_language_model(model, training_dtype(), pack=False)  # LoRA needs plain layers
    records = task_records(lm, prompts, max_answer_tokens)
    initial = None
    if init_streams is not None:
        import torch

        from edgestream.llm.msa import load_streams

        initial, _ = load_streams(init_streams, lm.model, torch.float32)
    started = time.time()
    kind = "stream (main first)" if stream_config else "token"
    with training_progress(kind, config.steps, rank, started) as (_bar, report):
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
    export: Annotated[
        Path | None,
        typer.Option(help="Write final draft weights here.", callback=writable_file("--export")),
    ] = None,
    replay: ReplayRuns = None,
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
        lambda base, records, replayed, _at, report: train_draft(
            base, records + replayed, layers, config, out, model, report
        ),
        replay=replay or (),
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
    export: Annotated[
        Path | None,
        typer.Option(help="Write final head weights here.", callback=writable_file("--export")),
    ] = None,
    replay: ReplayRuns = None,
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
        lambda base, records, replayed, at, report: train_medusa(
            base,
            records + replayed,
            at,
            medusa_config,
            config,
            out,
            model,
            report,
            None if init_heads is None else load_medusa(init_heads, base, torch.float32)[0],
        ),
        replay=replay or (),
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
