"""Choose the word LM's fusion settings (weight, word bonus, unknown-word penalty) on a dev set.

Every new acoustic model shifts the balance between its own scores and the LM's (docs/asr.md:
the better the model, the more weight the LM takes), so the settings are retuned per release.
The encoder runs once per utterance; then the beam search runs once per setting over those
log-probs, in `--jobs` processes:

    python -m edgestream.bench.fusion --manifest runs/asr/corpus26/dev.jsonl \\
        --model runs/asr/train15/model.safetensors --weights 0.6,0.7,0.8 --bonuses 2,2.5,3

Each setting's WER is printed for the whole set and for its even- and odd-numbered halves:
choose on one half and check on the other, because on ~160 utterances settings less than about
half a point apart are not told apart (stop 19's halves disagreed by 0.7 points).
The log-probs come from the offline chunk-masked forward pass, which the streaming engine
equals (tests/asr/test_streaming.py), so the settings carry over to `transcribe` unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path

import jiwer
import numpy as np
import torch

from edgestream.asr.audio import read_audio
from edgestream.asr.decode import LmFusion, Vocabulary, ctc_prefix_beam_search
from edgestream.asr.features import compute_fbank
from edgestream.asr.lm import NgramLm, load_lm
from edgestream.asr.model_io import AsrModel, load_model
from edgestream.asr.streaming import StreamingOptions
from edgestream.bench.asr import Utterance, normalize_text, read_bench_manifest


@dataclass(frozen=True)
class FusionSetting:
    weight: float
    word_bonus: float
    unknown_penalty: float


@dataclass(frozen=True)
class FusionScore:
    setting: FusionSetting
    wer: float
    wer_even: float  # utterances 0, 2, 4, ... of the manifest
    wer_odd: float


@torch.inference_mode()
def encoder_log_probs(
    asr: AsrModel, utterances: list[Utterance], options: StreamingOptions
) -> list[np.ndarray]:
    """Each utterance's CTC log-probs (frames, vocab) at the options' chunk and left context."""
    result = []
    for utterance in utterances:
        features = asr.cmvn.normalize(compute_fbank(read_audio(utterance.audio)))
        log_probs, _ = asr.model(
            torch.from_numpy(features)[None],
            torch.tensor([len(features)]),
            chunk=options.chunk_frames,
            left_chunks=options.left_chunks,
        )
        result.append(log_probs[0].numpy())
    return result


@dataclass(frozen=True)
class _Task:
    """What every worker needs, sent to each once (the LM is the large part)."""

    log_probs: list[np.ndarray]
    references: list[str]
    vocabulary: Vocabulary
    lm: NgramLm
    beam: int


_task: _Task | None = None


def _set_task(task: _Task) -> None:
    global _task
    _task = task


def _score(setting: FusionSetting) -> FusionScore:
    task = _task
    assert task is not None, "_set_task runs first, in each worker"
    fusion = LmFusion(
        task.lm, task.vocabulary, setting.weight, setting.word_bonus, setting.unknown_penalty
    )
    hypotheses = [
        normalize_text(task.vocabulary.decode(ctc_prefix_beam_search(lp, task.beam, fusion=fusion)))
        for lp in task.log_probs
    ]
    references = task.references
    return FusionScore(
        setting,
        float(jiwer.wer(references, hypotheses)),
        float(jiwer.wer(references[0::2], hypotheses[0::2])),
        float(jiwer.wer(references[1::2], hypotheses[1::2])),
    )


def fusion_grid(
    asr: AsrModel,
    utterances: list[Utterance],
    lm: NgramLm,
    settings: list[FusionSetting],
    beam: int = 32,
    options: StreamingOptions = StreamingOptions(),
    jobs: int = 1,
) -> list[FusionScore]:
    """WER of every setting, in the order given."""
    if len(utterances) < 2:
        raise ValueError(f"expected at least 2 utterances (two halves), got {len(utterances)}")
    if not settings:
        raise ValueError("expected at least one fusion setting")
    references = [normalize_text(u.text) for u in utterances]
    task = _Task(encoder_log_probs(asr, utterances, options), references, asr.vocabulary, lm, beam)
    if jobs <= 1:
        _set_task(task)
        return [_score(setting) for setting in settings]
    with ProcessPoolExecutor(jobs, initializer=_set_task, initargs=(task,)) as pool:
        return list(pool.map(_score, settings))


def _floats(text: str) -> list[float]:
    try:
        return [float(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, required=True, help="dev manifest (JSON Lines)")
    parser.add_argument("--model", default="default", help="'default' or a model file")
    parser.add_argument("--lm", default="default", help="'default' or an ARPA file")
    parser.add_argument("--weights", type=_floats, default=[0.6, 0.7, 0.8, 0.9])
    parser.add_argument("--bonuses", type=_floats, default=[1.5, 2.0, 2.5, 3.0])
    parser.add_argument(
        "--penalties",
        type=_floats,
        default=[LmFusion.unknown_penalty],
        help="per character of an unknown word; negative, so write --penalties=-1,-2",
    )
    parser.add_argument("--beam", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None, help="at most this many utterances")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the beam searches")
    parser.add_argument("--json", type=Path, default=None, help="also write the scores here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        lm = load_lm(args.lm)
        if lm is None:
            raise ValueError("--lm none leaves nothing to tune: give 'default' or an ARPA file")
        scores = fusion_grid(
            load_model(args.model),
            read_bench_manifest(args.manifest, args.limit),
            lm,
            [FusionSetting(*s) for s in product(args.weights, args.bonuses, args.penalties)],
            args.beam,
            jobs=args.jobs,
        )
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print("weight  bonus  penalty    WER   even    odd")
    for s in sorted(scores, key=lambda score: score.wer):
        c = s.setting
        print(
            f"{c.weight:6.2f} {c.word_bonus:6.2f} {c.unknown_penalty:8.2f} "
            f"{s.wer:6.2%} {s.wer_even:6.2%} {s.wer_odd:6.2%}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(s) for s in scores], indent=1) + "\n", "utf-8")


if __name__ == "__main__":
    main()
