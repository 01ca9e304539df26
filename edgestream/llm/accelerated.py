"""Distil and train the speculative streams in one process on an accelerator, within a budget.

`edgestream train streams` is built for CPUs: resumable shards, atomic checkpoints, DDP over
gloo, a few sequences per step. On a GPU the same work is minutes, not hours, and the machine
is often lent for minutes too, so this recipe keeps everything in device memory, distils with
large batches, trains one or more arms (feed-forward adapter ranks) on the same answers, and
stops at a wall-clock deadline with its held-out accuracy measured. The held-out accuracy is
also measured every `--eval-seconds` while training, and an arm keeps its best streams: many
epochs over a few thousand answers can overfit. The distilled answers are written too, as
token ids, so a later run (on a CPU or another accelerator) can train on them without
distilling again. The bundled streams were trained with it (model card).

    python -m edgestream.llm.accelerated prompts PROMPTS.json.gz [--cap gsm8k=3000]
        [--exclude-held-out RUN]
    python -m edgestream.llm.accelerated train MODEL PROMPTS.json.gz INIT_STREAMS OUT
        [--device cuda] [--arms 0,32] [--deadline SECONDS] [--answers ANSWERS.json.gz]
    python -m edgestream.llm.accelerated medusa MODEL PROMPTS.json.gz ANSWERS.json.gz OUT
        [--device cuda] [--deadline SECONDS]

The prompts file is gzipped JSON, `[{"category", "key", "prompt"}]` (train splits only), so a
machine without the task data can still distil. `train` writes OUT/streams-ffnR.safetensors
per arm, OUT/report.json and OUT/answers.json.gz (`{"model", "dtype", "max_new_tokens",
"answers": [{"category", "key", "answer": [token ids], "held_out"}]}`) when it distils.
`medusa` trains the Medusa-1 baseline's heads on such answers (the same held-out ones) and
writes OUT/medusa.safetensors (bfloat16 unless `--save-dtype float32`: 40 MB for 4 heads
over an 8,192-token draft vocabulary, 81 MB in float32) and OUT/report.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgestream.llm.distill import SplitCapture, distill_batch, load_shards, shards_in
from edgestream.llm.loading import LanguageModel, load_language_model, parse_dtype
from edgestream.llm.medusa import MedusaConfig, MedusaHeads, MedusaObjective, save_medusa
from edgestream.llm.msa import SpeculativeStreams, load_streams, save_streams
from edgestream.llm.tasks import CATEGORIES, TaskPrompt, task_prompts
from edgestream.llm.train import (
    IGNORE,
    Batch,
    StreamObjective,
    TrainConfig,
    clipped_step,
    cosine_to_a_tenth,
    frequent_answer_tokens,
    held_out_top1,
    hold_out,
)

# Of a run's deadline: distillation stops at this fraction, training at the next, and the
# rest is left for the final held-out evaluation and saving.
DISTILL_SHARE, TRAIN_END = 0.55, 0.88
STREAM_WEIGHT = TrainConfig().stream_weight  # alpha_j, as in `edgestream train streams`


def write_prompts(
    out: Path, data: Path | None, caps: dict[str, int], exclude: list[list[int]], lm: LanguageModel
) -> int:
    """Every training prompt of every task (at most caps[category] of one), categories
    interleaved, minus the prompts whose token ids are in `exclude`. Returns how many."""
    groups = [task_prompts(c, "train", data, caps.get(c, 1 << 30)) for c in CATEGORIES]
    mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    excluded = {tuple(ids) for ids in exclude}
    kept = [p for p in mixed if tuple(lm.encode_prompt(p.prompt)) not in excluded]
    rows = [{"category": p.category, "key": p.key, "prompt": p.prompt} for p in kept]
    out.write_bytes(gzip.compress(json.dumps(rows).encode(), 9))
    return len(rows)


def read_prompts(path: Path) -> list[TaskPrompt]:
    try:
        rows = json.loads(gzip.decompress(path.read_bytes()))
        return [TaskPrompt(r["category"], r["key"], r["prompt"]) for r in rows]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a gzipped JSON list of prompts ({err})") from err


def answer_batch(
    records: list[dict], positions: int, gamma: int, rng: random.Random, device: str
) -> Batch:
    """`train.make_batch` for answer positions, with the targets gathered by tensor ops on the
    device: at thousands of positions per step, make_batch's per-element loop would cost more
    than the accelerator's step."""
    B, lengths = len(records), [len(r["tokens"]) for r in records]
    L = max(lengths)
    tokens = torch.full((B, L), IGNORE, dtype=torch.long, device=device)
    hidden = torch.nn.utils.rnn.pad_sequence([r["split_hidden"] for r in records], batch_first=True)
    hidden = F.pad(hidden, (0, 0, 0, L - hidden.shape[1]))
    chosen = torch.zeros(B, positions, dtype=torch.long)
    valid = torch.zeros(B, positions, dtype=torch.bool)
    for b, r in enumerate(records):
        tokens[b, : lengths[b]] = r["tokens"]
        # Stream j at t predicts t+1+j: from the last prompt token to where stream 1 has a label.
        answer = range(r["prompt_length"] - 1, lengths[b] - 2)
        picked = sorted(rng.sample(answer, min(positions, len(answer))))
        chosen[b, : len(picked)] = torch.tensor(picked, dtype=torch.long)
        valid[b, : len(picked)] = True
    chosen, valid = chosen.to(device), valid.to(device)
    index = chosen[:, :, None] + 2 + torch.arange(gamma, device=device)  # (B, n, gamma)
    inside = index < torch.tensor(lengths, device=device)[:, None, None]
    targets = tokens.gather(1, index.clamp(max=L - 1).flatten(1)).view(B, positions, gamma)
    targets = torch.where(inside & valid[:, :, None], targets, IGNORE)
    prompt_lengths = torch.tensor([r["prompt_length"] for r in records], device=device)
    return Batch(hidden, tokens, chosen, targets, prompt_lengths)


def token_budget_batches(lengths: list[int], max_batch: int, max_tokens: int) -> list[list[int]]:
    """Prompt indices in batches of similar length, each at most `max_batch` prompts and at
    most `max_tokens` padded prompt tokens. A decoding step costs about the same for 256 rows
    as for 1024, so short prompts go in large batches; the budget bounds prefill's attention
    scores (rows x heads x length squared) for long ones."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):  # each batch's last is longest
        if (
            not batches
            or len(batches[-1]) >= max_batch
            or ((len(batches[-1]) + 1) * lengths[i] > max_tokens)
        ):
            batches.append([])
        batches[-1].append(i)
    return batches


def distill_halving(
    lm: LanguageModel, prompts: list[TaskPrompt], split: int, max_new_tokens: int
) -> list[dict]:
    """`distill_batch`, with each prompt's key, halving a batch that runs out of memory."""
    try:
        records = distill_batch(lm, prompts, split, max_new_tokens)
    except torch.OutOfMemoryError:
        if len(prompts) == 1:
            raise
        torch.cuda.empty_cache()
        half = len(prompts) // 2
        print(f"out of memory at {len(prompts)} prompts: halving the batch")
        return distill_halving(lm, prompts[:half], split, max_new_tokens) + distill_halving(
            lm, prompts[half:], split, max_new_tokens
        )
    for prompt, record in zip(prompts, records, strict=True):
        record["key"] = prompt.key
    return records


def distill_until(
    lm: LanguageModel,
    prompts: list[TaskPrompt],
    split: int,
    args: argparse.Namespace,
    stop_at: float,
    rng: random.Random,
) -> list[dict]:
    """Greedy answers with split-layer states, in token-budget batches, until `stop_at`."""
    lengths = [len(lm.encode_prompt(p.prompt)) for p in prompts]
    batches = token_budget_batches(lengths, args.distill_batch, args.distill_tokens)
    rng.shuffle(batches)  # a distillation cut short by the deadline still mixes every task
    records: list[dict] = []
    for i, batch in enumerate(batches):
        if time.time() > stop_at:
            print(f"distillation stopped at the deadline: {i} of {len(batches)} batches")
            break
        records += distill_halving(lm, [prompts[j] for j in batch], split, args.max_new_tokens)
        print(
            f"distilled {i + 1}/{len(batches)} batches ({len(batch)} prompts of up to "
            f"{max(lengths[j] for j in batch)} tokens)"
        )
    return records


def records_from_answers(
    lm: LanguageModel, prompts: list[TaskPrompt], path: Path, split: int, max_tokens: int
) -> list[dict]:
    """Records as `distill_batch` makes them, for the answers an earlier run wrote
    (`write_answers`), each marked `held_out` as it was there: one forward pass over each
    prompt plus answer captures the split-layer states, far cheaper than generating again."""
    try:
        written = json.loads(gzip.decompress(path.read_bytes()))["answers"]
        by_key = {(p.category, p.key): p for p in prompts}
        pairs = [(by_key[a["category"], a["key"]], a) for a in written]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not answers to these prompts ({err!r})") from err
    sequences = [lm.encode_prompt(p.prompt) + a["answer"] for p, a in pairs]
    # The last answer token is never fed back, so its state does not exist (as in distillation).
    fed = [s[:-1] for s in sequences]
    records: list[dict] = [{} for _ in pairs]
    for batch in token_budget_batches([len(f) for f in fed], len(fed), max_tokens):
        capture = SplitCapture(lm, split)
        try:
            rows = torch.nn.utils.rnn.pad_sequence([torch.tensor(fed[i]) for i in batch], True)
            lm.model.hidden_states(rows, lm.model.new_cache(rows.shape[1], batch_size=len(batch)))
        finally:
            capture.close()
        states = capture.chunks[0]
        for b, i in enumerate(batch):
            prompt, answer = pairs[i]
            records[i] = {
                "category": prompt.category,
                "key": prompt.key,
                "tokens": torch.tensor(sequences[i]),
                "prompt_length": len(sequences[i]) - len(answer["answer"]),
                "split_hidden": states[b, : len(fed[i])].to(torch.bfloat16),
                "held_out": bool(answer["held_out"]),
            }
    return records


def write_answers(path: Path, records: list[dict], held_out: int, args: argparse.Namespace) -> None:
    """The distilled answers as token ids (the prompts' ids follow from their keys), the
    first `held_out` of `records` marked as held out."""
    answers = [
        {
            "category": r["category"],
            "key": r["key"],
            "answer": r["tokens"][r["prompt_length"] :].tolist(),
            "held_out": i < held_out,
        }
        for i, r in enumerate(records)
    ]
    made = {"model": str(args.model), "dtype": "bfloat16", "max_new_tokens": args.max_new_tokens}
    path.write_bytes(gzip.compress(json.dumps({**made, "answers": answers}).encode(), 6))


def train_arm(
    lm: LanguageModel,
    init_streams: Path,
    ffn_rank: int,
    training: list[dict],
    held: list[dict],
    args: argparse.Namespace,
    seconds: float,
    rng: random.Random,
) -> tuple[SpeculativeStreams, dict]:
    """Continue `init_streams` (plus feed-forward adapters of `ffn_rank`) for `seconds`."""
    streams, _ = load_streams(init_streams, lm.model, torch.float32)
    if ffn_rank:
        streams.add_feed_forward_adapters(lm.model.config, ffn_rank)
    streams = streams.to(args.device)
    objective = StreamObjective(lm.model, streams, streams.split)
    arm = fit_until(
        streams,
        lambda batch: objective(batch, STREAM_WEIGHT),
        streams.config.n_streams,
        training,
        held,
        args,
        seconds,
        rng,
        f"ffn {ffn_rank}",
    )
    return streams, {"ffn_rank": ffn_rank, **arm}


def fit_until(
    trained: nn.Module,
    objective: Callable[[Batch], tuple[Tensor, Tensor, Tensor]],
    depth: int,
    training: list[dict],
    held: list[dict],
    args: argparse.Namespace,
    seconds: float,
    rng: random.Random,
    label: str,
) -> dict:
    """Train `trained` for `seconds` on batches of `training` (AdamW, linear warm-up, cosine
    decay over the time budget to a tenth), checking held-out top-1 per draft depth every
    `args.eval_seconds`; `trained` ends holding its best weights. Returns the arm's report."""
    trained.requires_grad_(True).train()
    arm: dict = {"budget_seconds": round(seconds, 1)}

    # Every answer position of the held-out answers, as `edgestream train streams` measures;
    # rounded here, once, so the report's before, checks and after are the same numbers.
    @torch.no_grad()
    def measure() -> list[float]:
        config = TrainConfig(batch_sequences=8)
        top1 = held_out_top1(objective, lambda call, batch: call(batch), held, depth, config)
        return [round(a, 4) for a in top1]

    best = arm["held_out_top1_before"] = measure()
    best_state = {k: v.clone() for k, v in trained.state_dict().items()}
    optimizer = torch.optim.AdamW(trained.parameters(), lr=args.lr, weight_decay=0.0)
    started, step, log, checks = time.time(), 0, [], []
    next_check = args.eval_seconds
    while seconds > 0 and time.time() - started < seconds:
        progress = (time.time() - started) / seconds
        warm = min(1.0, (step + 1) / args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * warm * cosine_to_a_tenth(progress)
        sequences = rng.sample(training, min(args.batch, len(training)))
        loss, hits, labelled = objective(
            answer_batch(sequences, args.positions, depth, rng, args.device)
        )
        clipped_step(optimizer, trained, loss)
        step += 1
        if step % 50 == 0:
            accuracy = [round(a, 4) for a in (hits / labelled.clamp(min=1)).tolist()]
            log.append([step, round(time.time() - started, 1), round(loss.item(), 4), accuracy])
            print(f"{label}: step {step}, loss {loss.item():.3f}, top-1 {accuracy}")
        if args.eval_seconds and time.time() - started > next_check:
            next_check += args.eval_seconds
            best, best_state = _keep_best(trained, measure, best, best_state, step, checks)
            trained.train()
    best, best_state = _keep_best(trained, measure, best, best_state, step, checks)
    trained.load_state_dict(best_state)
    arm.update(steps=step, train_seconds=round(time.time() - started, 1), log=log, checks=checks)
    arm["held_out_top1_after"] = best
    print(f"{label}: held-out top-1 {arm['held_out_top1_before']} -> {best}")
    return arm


def _keep_best(
    trained: nn.Module,
    measure: Callable[[], list[float]],
    best: list[float],
    best_state: dict,
    step: int,
    checks: list,
) -> tuple[list[float], dict]:
    """Measure held-out top-1; the weights with the highest sum over depths (the expected
    accepted length of a chain draft grows with each depth's accuracy) are kept."""
    trained.eval()
    top1 = measure()
    checks.append([step, top1])
    print(f"step {step}: held-out top-1 {checks[-1][1]}")
    if sum(top1) > sum(best):
        return top1, {k: v.clone() for k, v in trained.state_dict().items()}
    return best, best_state


def train(args: argparse.Namespace) -> None:
    try:
        _train(args)
    finally:
        torch.set_default_device(None)


def medusa(args: argparse.Namespace) -> None:
    try:
        _medusa(args)
    finally:
        torch.set_default_device(None)


def _load_on_device(args: argparse.Namespace) -> tuple[LanguageModel, list[TaskPrompt]]:
    prompts = read_prompts(args.prompts)
    lm = load_language_model(args.model, "bfloat16", pack=False)  # packed has no backward
    lm.model.to(args.device).requires_grad_(False)
    # Every tensor the engine and the training code create lands beside the model.
    torch.set_default_device(args.device)
    return lm, prompts


def _run_facts(command: str, args: argparse.Namespace, arm: dict, training: list) -> dict:
    """What a saved weights file records about the run that trained it."""
    return {
        "trainer": f"python -m edgestream.llm.accelerated {command}",
        "device": _device_name(args),
        "steps": arm["steps"],
        "batch": args.batch,
        "positions": args.positions,
        "sequences": len(training),
        "held_out_top1": arm["held_out_top1_after"],
    }


def _device_name(args: argparse.Namespace) -> str:
    return torch.cuda.get_device_name() if args.device == "cuda" else args.device


def _train(args: argparse.Namespace) -> None:
    started = time.time()
    deadline = args.deadline or math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save_report() -> None:
        report["wall_seconds"] = round(time.time() - started, 1)
        (args.out / "report.json").write_text(json.dumps(report, indent=1))

    lm, prompts = _load_on_device(args)
    split = load_streams(args.init_streams, lm.model)[0].split
    rng = random.Random(0)
    if args.answers:
        records = records_from_answers(lm, prompts, args.answers, split, args.distill_tokens)
        print(f"{len(records)} answers read from {args.answers}, {time.time() - started:.0f} s")
    else:
        records = distill_until(lm, prompts, split, args, started + DISTILL_SHARE * deadline, rng)
    report.update(
        distill_seconds=round(time.time() - started, 1),
        sequences=len(records),
        answer_tokens=sum(len(r["tokens"]) - r["prompt_length"] for r in records),
        arms={},
    )
    save_report()
    if args.answers:  # the same held-out answers as the run that wrote them
        held = [r for r in records if r["held_out"]]
        training = [r for r in records if not r["held_out"]]
    else:
        rng.shuffle(records)
        held, training = records[: args.held_out], records[args.held_out :]
        write_answers(args.out / "answers.json.gz", records, len(held), args)
    ranks = [int(r) for r in args.arms.split(",")]
    train_until = min(started + TRAIN_END * deadline, time.time() + args.train_seconds * len(ranks))
    for n, rank in enumerate(ranks):
        seconds = (train_until - time.time()) / (len(ranks) - n)
        streams, arm = train_arm(lm, args.init_streams, rank, training, held, args, seconds, rng)
        report["arms"][f"ffn{rank}"] = arm
        facts = {"init_streams": str(args.init_streams), **_run_facts("train", args, arm, training)}
        with torch.device("cpu"):
            save_streams(streams.cpu(), args.out / f"streams-ffn{rank}.safetensors", facts)
        save_report()


def _medusa(args: argparse.Namespace) -> None:
    """Medusa-1 heads on an earlier run's answers, within the deadline: the baseline trained
    on the same answers as the streams, on the same machine."""
    started = time.time()
    deadline = args.deadline or math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    lm, prompts = _load_on_device(args)
    n_layers = lm.model.config.n_layers
    # The heads read the last layer's output: capture it there once, for every answer.
    records = records_from_answers(lm, prompts, args.answers, n_layers, args.distill_tokens)
    held = [r for r in records if r["held_out"]]
    training = [r for r in records if not r["held_out"]]
    config = MedusaConfig(n_heads=args.heads, draft_vocab_size=args.draft_vocab)
    heads = MedusaHeads(lm.model.config, config)
    vocab = frequent_answer_tokens(training, args.draft_vocab) if args.draft_vocab else None
    heads.init_from(lm.model, vocab)
    objective = MedusaObjective(lm.model, heads)
    weights = config.loss_decay ** torch.arange(config.n_heads, dtype=torch.float)
    seconds = min(args.train_seconds, started + TRAIN_END * deadline - time.time())
    arm = fit_until(
        heads,
        lambda batch: objective(batch, weights),
        config.n_heads,
        training,
        held,
        args,
        seconds,
        random.Random(0),
        "medusa",
    )
    facts = {"answers": str(args.answers), **_run_facts("medusa", args, arm, training)}
    with torch.device("cpu"):
        save_medusa(heads.cpu(), args.out / "medusa.safetensors", facts, args.save_dtype)
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "sequences": len(records)}
    report.update(medusa=arm, wall_seconds=round(time.time() - started, 1))
    (args.out / "report.json").write_text(json.dumps(report, indent=1))


def prompts_command(args: argparse.Namespace) -> None:
    lm = load_language_model(args.model, "bfloat16")
    caps = {}
    for cap in args.cap:
        category, _, count = cap.partition("=")
        if category not in CATEGORIES or not count.isdigit():
            raise SystemExit(f"--cap {cap!r}: expected CATEGORY=N, CATEGORY one of {CATEGORIES}")
        caps[category] = int(count)
    exclude = []
    for run in args.exclude_held_out:
        _, held = hold_out(load_shards(shards_in(run, args.split)), args.held_out)
        exclude += [r["tokens"][: r["prompt_length"]].tolist() for r in held]
    n = write_prompts(args.out, args.data, caps, exclude, lm)
    print(f"{n} prompts written to {args.out}")


def _training_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--device", default="cuda")
    command.add_argument(
        "--distill-tokens", type=int, default=400_000, help="padded tokens per batch, at most"
    )
    command.add_argument("--batch", type=int, default=64, help="sequences per step")
    command.add_argument("--positions", type=int, default=128, help="positions per sequence")
    command.add_argument("--lr", type=float, default=1e-3)
    command.add_argument("--warmup", type=int, default=100)
    command.add_argument("--train-seconds", type=float, default=300, help="per arm, at most")
    command.add_argument("--deadline", type=float, default=0, help="whole run, s (0: none)")
    command.add_argument(
        "--eval-seconds", type=float, default=60, help="held-out check interval (0: end only)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prompts", help="write the training prompts file")
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--data", type=Path, default=None, help="shared data folder")
    p.add_argument("--cap", action="append", default=[], help="CATEGORY=N: at most N of it")
    p.add_argument(
        "--exclude-held-out",
        type=Path,
        action="append",
        default=[],
        help="a streams run folder whose held-out answers' prompts to leave out",
    )
    p.add_argument("--held-out", type=int, default=64, help="that run's --dev-sequences")
    p.add_argument("--split", type=int, default=20, help="that run's distill-at-N")
    t = commands.add_parser("train", help="distil and train streams within a deadline")
    t.add_argument("model")
    t.add_argument("prompts", type=Path)
    t.add_argument("init_streams", type=Path)
    t.add_argument("out", type=Path)
    t.add_argument("--arms", default="0", help="feed-forward adapter ranks, an arm each")
    t.add_argument("--distill-batch", type=int, default=1024, help="prompts per batch, at most")
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--held-out", type=int, default=64, help="distilled answers held out")
    t.add_argument(
        "--answers",
        type=Path,
        default=None,
        help="an earlier run's answers.json.gz: train on them instead of distilling",
    )
    _training_options(t)
    m = commands.add_parser("medusa", help="train Medusa-1 heads on an earlier run's answers")
    m.add_argument("model")
    m.add_argument("prompts", type=Path)
    m.add_argument("answers", type=Path, help="an earlier run's answers.json.gz")
    m.add_argument("out", type=Path)
    m.add_argument("--heads", type=int, default=MedusaConfig.n_heads)
    m.add_argument("--draft-vocab", type=int, default=MedusaConfig.draft_vocab_size)
    m.add_argument(
        "--save-dtype",
        type=parse_dtype,
        default=torch.bfloat16,
        help="the file's dtype: bfloat16 (default) halves it; 4 heads over 8,192 draft tokens "
        "are 81 MB in float32, more than a lent machine's 64 MiB of returned files",
    )
    _training_options(m)
    return parser


def main() -> None:
    args = _parser().parse_args()
    {"prompts": prompts_command, "train": train, "medusa": medusa}[args.command](args)


if __name__ == "__main__":
    main()
