"""Training recipe for the streaming Conformer-CTC: cached features, SpecAugment, dynamic chunks.

- Features: the manifests' fbank frames are computed once into one float16 array on disk
  (`FeatureStore`), next to the checkpoint, an utterance at a time (flat memory however large
  the corpus); an epoch then reads it memory-mapped.
- Batches: utterances sorted by length and cut into batches of at most `max_frames` padded
  fbank frames, shuffled per epoch and dealt round-robin to the ranks; the first
  `curriculum_epochs` run them short to long, with full context and no SpecAugment, which gets
  CTC off its all-blank plateau much sooner.
- Dynamic chunk training (WeNet's U2): per batch, full context with probability
  `full_context_prob`, else a chunk of 1..`max_chunk` encoder frames and a random number of
  left chunks (or all), so one model serves every latency.
- Vocal tract length perturbation (`warp_frequencies`, optional: `vtlp_prob`) stretches some
  utterances' spectra, for voices no synthesiser in the corpus has; band limiting
  (`limit_bandwidth`, optional: `bandlimit_prob`) cuts some above a random frequency, as
  telephones, 8 kHz files, lossy codecs and old recordings do; a random equaliser
  (`colour_spectrum`, optional: `eq_prob`) tilts and ripples some spectra by a few decibels,
  as microphones, rooms and loudspeakers colour real recordings.
- SpecAugment (two frequency and two time masks, WeNet's sizes) on CMVN-normalised features,
  after noise-only frames are added around some utterances (`pad_with_silence`).
- AdamW, linear warm-up then cosine decay; gradient clipping; checkpoints written atomically
  every epoch and resumed; validation WER every epoch on the dev manifest, streaming at
  `eval_chunk` frames with `eval_left_chunks` left chunks.
- The released weights average the last `average_epochs` epochs' weights (as WeNet's
  `average_model.py` and icefall do): each epoch's weights are kept beside the checkpoint
  until they fall out of the window. The dev WER of the average is recorded next to the last
  epoch's.
- Runs under `torchrun --nproc_per_node=N` (DistributedDataParallel over gloo on CPU).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import multiprocessing
import os
import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import jiwer
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from edgestream.asr.conformer import ConformerConfig, ConformerCTC
from edgestream.asr.decode import Vocabulary, ctc_greedy, make_vocabulary, vocabulary_from_metadata
from edgestream.asr.features import (
    NUM_MEL_BINS,
    SAMPLE_RATE,
    GlobalCmvn,
    compute_fbank,
    load_audio,
)
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import AsrModel, load_model, save_model
from edgestream.training import distributed_context, save_atomic


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 6
    lr: float = 2e-3
    weight_decay: float = 1e-3
    warmup_steps: int = 300
    max_frames: int = 12_000  # padded fbank frames per batch and rank (120 s of audio)
    full_context_prob: float = 0.3
    max_chunk: int = 25  # encoder frames (40 ms each)
    max_left_chunks: int = 8
    freq_masks: int = 2
    freq_mask_bins: int = 10
    time_masks: int = 2
    time_mask_frames: int = 50
    # Noise-only frames before and after most utterances (uniform lengths in these ranges,
    # white noise from -90 to -40 dBFS). Measured need: trained without, the model heard a
    # letter ("e", p = 0.33 at encoder frame 2) at the start of any stream, silence included:
    # every synthetic utterance starts with speech at once, so it learnt that speech starts
    # there. An epoch with half the utterances padded, from 0 frames, left that unchanged
    # (p = 0.36), so most utterances now get at least 80 ms, as a microphone stream would.
    silence_prob: float = 0.8
    min_lead_silence_frames: int = 8
    max_lead_silence_frames: int = 100
    max_trail_silence_frames: int = 50
    # Curriculum (SortaGrad, Amodei et al. 2016): the first epochs go from short utterances to
    # long, with full context and no SpecAugment. Measured here: without it CTC sat on its
    # all-blank plateau (loss 2.8 per token) for 700+ steps on the synthetic corpus.
    curriculum_epochs: int = 1
    # VTLP (Jaitly & Hinton 2013): with this probability an utterance's spectrum is stretched by
    # a factor drawn uniformly from 1 +- vtlp_max_warp. Why: a model trained on a handful of
    # synthetic voices was 2x worse than pocketsphinx on voices outside them (docs/asr.md).
    vtlp_prob: float = 0.0
    vtlp_max_warp: float = 0.1
    # Band limiting: with this probability an utterance loses what lies above a cutoff drawn
    # uniformly from [min_cutoff_hz, max_cutoff_hz], at 10-200 log-mel units per octave (steep
    # filters and gentle microphone roll-offs), down to the dither floor. Measured need: the
    # stop-20 model went from 8.3% WER to 58.6% on test audio low-passed at 4 kHz (an 8 kHz
    # file), and the real recordings in edgestream/bench/real_speech have little above 5 kHz.
    bandlimit_prob: float = 0.0
    min_cutoff_hz: float = 3_000.0
    max_cutoff_hz: float = 7_000.0
    # Random equaliser: with this probability an utterance's spectrum is multiplied by a smooth
    # random gain curve of at most +-eq_max_db (a tilt plus a slow ripple over the mel axis).
    # Why: synthesisers write every voice through the same flat "microphone", while real
    # recordings come through microphones, rooms and codecs that tilt and colour the spectrum,
    # and global CMVN does not remove that.
    eq_prob: float = 0.0
    eq_max_db: float = 10.0
    # Continuous speech: with this probability a batch's utterances are joined in pairs (each
    # with its own augmentation and silence, so the join is a pause between two speakers), one
    # transcript for both. Why: live, a speaker goes on after a short pause and the attention's
    # left context then holds the previous sentence, which single utterances never show the
    # model; it lost 2 points of WER there (docs/asr.md, "Live delays"). Whole batches are
    # joined, not single rows: a batch is sorted by length, so its pairs are of like length and
    # the padded frames stay as many as before.
    concat_prob: float = 0.0
    # Consistency-regularised CTC (CR-CTC, Yao et al., ICLR 2025): when > 0, every row is
    # trained twice in the same batch, the two copies differing only in their SpecAugment masks,
    # and this weight times the KL divergence between the copies' frame posteriors (each
    # against the other, detached) joins the CTC loss. Why: the acoustic model, not the LM, is
    # what keeps the synthetic test above its target (docs/asr.md, "Run 13"), and CR-CTC is
    # the CTC recipe that closed most of the gap to transducers there (0.2 in their recipe,
    # with more time masking). A step then costs about twice as much: halve max_frames to keep
    # the same number of steps.
    consistency_weight: float = 0.0
    eval_chunk: int = 16  # 640 ms
    eval_left_chunks: int = 4
    eval_utterances: int = 300
    # "char", or "bpe-N" (N SentencePiece BPE pieces learnt from the texts); None: "char" from
    # scratch, the init model's own with `init` (another one there swaps in a fresh CTC head)
    vocabulary: str | None = None
    average_epochs: int = 1  # the released model averages the last N epochs' weights
    # With an init model: insert this many near-identity Conformer blocks, spread evenly
    # (`deepened`), to add capacity without starting over.
    grow_layers: int = 0
    # Dropout for this run, overriding the model's (an init model's, or the model config's):
    # a fine-tune may train with less regularisation than the run it starts from.
    dropout: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.max_frames < 100 or self.lr <= 0:
            raise ValueError("expected epochs >= 1, max_frames >= 100 and lr > 0")
        if self.average_epochs < 1 or self.grow_layers < 0:
            raise ValueError("expected average_epochs >= 1 and grow_layers >= 0")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError("expected 0 <= dropout < 1")
        if not 0 <= self.min_lead_silence_frames <= self.max_lead_silence_frames:
            raise ValueError("expected 0 <= min_lead_silence_frames <= max_lead_silence_frames")
        if self.max_lead_silence_frames + self.max_trail_silence_frames > 300:
            raise ValueError("expected at most 300 frames (3 s) of added silence in all")
        if not (0 <= self.vtlp_prob <= 1 and 0 <= self.vtlp_max_warp < 0.5):
            raise ValueError("expected 0 <= vtlp_prob <= 1 and 0 <= vtlp_max_warp < 0.5")
        if not (0 <= self.bandlimit_prob <= 1 and 0 < self.min_cutoff_hz <= self.max_cutoff_hz):
            raise ValueError(
                "expected 0 <= bandlimit_prob <= 1 and 0 < min_cutoff_hz <= max_cutoff_hz"
            )
        if not (0 <= self.eq_prob <= 1 and 0 <= self.eq_max_db <= 30):
            raise ValueError("expected 0 <= eq_prob <= 1 and 0 <= eq_max_db <= 30")
        if not 0 <= self.concat_prob <= 1:
            raise ValueError("expected 0 <= concat_prob <= 1")
        if self.consistency_weight < 0:
            raise ValueError("expected consistency_weight >= 0")


class FeatureStore:
    """The fbank frames of one manifest's utterances, or of several manifests' one after the
    other, in one float16 array, with texts, groups and offsets.

    Built once (atomically: temporary files renamed) in `cache_dir`, keyed by the manifests'
    content, so an edited manifest is recomputed rather than read stale.
    """

    def __init__(
        self,
        manifests: str | Path | Sequence[str | Path],
        cache_dir: str | Path,
        workers: int = 1,
    ) -> None:
        if isinstance(manifests, str | Path):
            manifests = [manifests]
        paths = [Path(m) for m in manifests]
        if not paths:
            raise ValueError("expected at least one manifest")
        digest = hashlib.blake2b(digest_size=8)
        for path in paths:  # one manifest keys as its bytes alone, as before several were allowed
            if len(paths) > 1:
                digest.update(str(path.resolve()).encode() + b"\0")
            digest.update(path.read_bytes())
        stem = Path(cache_dir) / f"{'+'.join(p.stem for p in paths)}-{digest.hexdigest()}"
        frames_path, index_path = stem.with_suffix(".f16.npy"), stem.with_suffix(".json")
        if not index_path.exists():
            _build(paths, frames_path, index_path, workers)
        index = json.loads(index_path.read_text("utf-8"))
        self.frames = np.load(frames_path, mmap_mode="r")
        self.offsets: list[int] = index["offsets"]
        self.lengths: list[int] = index["lengths"]
        self.texts: list[str] = index["texts"]
        self.groups: list[str] = index["groups"]

    def __len__(self) -> int:
        return len(self.texts)

    def features(self, i: int) -> np.ndarray:
        return np.asarray(self.frames[self.offsets[i] : self.offsets[i] + self.lengths[i]])


def _fbank_of(audio: Path) -> np.ndarray:
    return compute_fbank(load_audio(audio)).astype(np.float16)


def _fbanks_in_order(audio: Sequence[Path], workers: int) -> Iterator[np.ndarray]:
    """Each file's frames, in order; several processes compute a window of files at a time,
    so memory holds one window's frames, not the corpus's."""
    if workers <= 1:
        yield from map(_fbank_of, audio)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    window = 256 * workers
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        for start in range(0, len(audio), window):
            yield from pool.map(_fbank_of, audio[start : start + window], chunksize=32)


def _build(
    manifests: Sequence[Path], frames_path: Path, index_path: Path, workers: int = 1
) -> None:
    """Frames are written to disk as each utterance is computed, so building a store takes
    memory for one utterance (or one window of them), not for the corpus (56 h of audio is
    3.2 GB of float16)."""
    entries = [(m.parent / e.audio, e) for m in manifests for e in read_manifest(m)]
    frames_path.parent.mkdir(parents=True, exist_ok=True)
    raw = frames_path.with_name(f".{frames_path.stem}.tmp.raw")
    lengths: list[int] = []
    with raw.open("wb") as out:
        for matrix in _fbanks_in_order([audio for audio, _ in entries], workers):
            lengths.append(len(matrix))
            out.write(matrix.tobytes())
    temporary = frames_path.with_name(f".{frames_path.stem}.tmp.npy")
    shape = (sum(lengths), NUM_MEL_BINS)
    header = {"descr": np.dtype(np.float16).str, "fortran_order": False, "shape": shape}
    with temporary.open("wb") as out, raw.open("rb") as frames:
        np.lib.format.write_array_header_1_0(out, header)
        shutil.copyfileobj(frames, out, 1 << 24)
    raw.unlink()
    os.replace(temporary, frames_path)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist()
    index = {
        "offsets": offsets,
        "lengths": lengths,
        "texts": [e.text for _, e in entries],
        "groups": [e.group or "all" for _, e in entries],
    }
    temporary = index_path.with_name(f".{index_path.name}.tmp")
    temporary.write_text(json.dumps(index), "utf-8")
    os.replace(temporary, index_path)


def length_batches(lengths: list[int], max_frames: int) -> list[list[int]]:
    """Indices sorted by length, cut so each batch's count x longest <= max_frames."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > max_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def spec_augment(features: Tensor, config: TrainConfig, rng: random.Random) -> Tensor:
    """Zero two frequency bands and two time spans (at most a fifth of the length) in place."""
    frames, bins = features.shape
    for _ in range(config.freq_masks):
        width = rng.randint(0, config.freq_mask_bins)
        start = rng.randint(0, bins - width)
        features[:, start : start + width] = 0
    for _ in range(config.time_masks):
        width = rng.randint(0, min(config.time_mask_frames, frames // 5))
        start = rng.randint(0, frames - width)
        features[start : start + width] = 0
    return features


def _mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log1p(np.asarray(hz) / 700.0)


@functools.cache
def _mel_bin_centres_hz() -> np.ndarray:
    """Centre frequencies of the fbank's mel bins (Kaldi's: 20 Hz to Nyquist)."""
    points = np.linspace(_mel(20.0), _mel(SAMPLE_RATE / 2), NUM_MEL_BINS + 2)[1:-1]
    return 700.0 * np.expm1(points / 1127.0)


def warp_frequencies(frames: np.ndarray, alpha: float) -> np.ndarray:
    """Log-mel frames (T, 80) of the same audio with its spectrum stretched by `alpha` (VTLP).

    VTLP's piecewise-linear warp: frequencies below a boundary (4.8 kHz x min(alpha, 1) / alpha)
    scale by alpha, the rest map linearly onto the band up to Nyquist, which stays fixed. Each
    output bin reads the input at the frequency that lands on its centre, interpolated between
    the two nearest bins: an approximation (the filters are triangles, not points) that needs
    no audio, so cached features can be warped.
    """
    centres, nyquist = _mel_bin_centres_hz(), SAMPLE_RATE / 2
    boundary = 4800.0 * min(alpha, 1.0) / alpha
    low = centres <= alpha * boundary
    source = np.where(
        low,
        centres / alpha,
        nyquist - (nyquist - centres) * (nyquist - boundary) / (nyquist - alpha * boundary),
    )
    position = np.interp(source, centres, np.arange(NUM_MEL_BINS, dtype=np.float64))
    left = np.floor(position).astype(int)
    right = np.minimum(left + 1, NUM_MEL_BINS - 1)
    weight = (position - left).astype(np.float32)
    return frames[:, left] * (1 - weight) + frames[:, right] * weight


def limit_bandwidth(frames: np.ndarray, cutoff_hz: float, loss_per_octave: float) -> np.ndarray:
    """Log-mel frames (T, 80) of the same audio through a low-pass filter: each bin whose centre
    lies above `cutoff_hz` loses `loss_per_octave` (natural-log units) per octave past it, and
    the front end's dither floor shows through, as it does in real low-passed audio."""
    octaves = np.log2(np.maximum(_mel_bin_centres_hz() / cutoff_hz, 1.0))
    return np.logaddexp(frames - loss_per_octave * octaves, _dither_floor()).astype(np.float32)


def colour_spectrum(frames: np.ndarray, gains_db: np.ndarray) -> np.ndarray:
    """Log-mel frames (T, 80) of the same audio through an equaliser whose gain at each mel
    bin's centre is `gains_db` (80,); where it cuts, the front end's dither floor shows through."""
    gains = gains_db * (math.log(10.0) / 10.0)  # decibels -> natural-log power, the fbank's unit
    return np.logaddexp(frames + gains.astype(np.float32), _dither_floor()).astype(np.float32)


def random_equaliser(rng: random.Random, max_db: float) -> np.ndarray:
    """Smooth random gains (80,) in dB within +-max_db: half of it a tilt from the lowest
    mel bin to the highest, half a cosine ripple of 0.5-2 cycles over the mel axis."""
    position = np.linspace(-1.0, 1.0, NUM_MEL_BINS)
    cycles, phase = rng.uniform(0.5, 2.0), rng.uniform(0.0, 2 * math.pi)
    tilt = rng.uniform(-1.0, 1.0) * position
    ripple = rng.uniform(-1.0, 1.0) * np.cos(math.pi * cycles * position + phase)
    return 0.5 * max_db * (tilt + ripple)


@functools.cache
def _dither_floor() -> np.ndarray:
    """The log-mel frame (80,) of digital silence, which the front end's dither fills."""
    return compute_fbank(np.zeros(16_000, dtype=np.float32)).mean(axis=0)


@dataclass
class Batch:
    features: Tensor  # (B, T, 80), CMVN-normalised
    lengths: Tensor  # (B,)
    targets: Tensor  # (sum of label lengths,)
    target_lengths: Tensor  # (B,)

    def to(self, device: torch.device) -> Batch:
        move = functools.partial(Tensor.to, device=device, non_blocking=True)
        return Batch(
            move(self.features), move(self.lengths), move(self.targets), move(self.target_lengths)
        )


@functools.cache
def _noise_fbank(level: int) -> np.ndarray:
    """Fbank frames (300, 80) of white noise at -90 + 10 x level dBFS (level 0..5)."""
    rng = np.random.default_rng(level)
    amplitude = 10 ** ((-90 + 10 * level) / 20)
    return compute_fbank((rng.standard_normal(30_400) * amplitude).astype(np.float32))


def pad_with_silence(utterance: np.ndarray, config: TrainConfig, rng: random.Random) -> np.ndarray:
    """Fbank frames with noise-only frames added before and after (see TrainConfig)."""
    if rng.random() >= config.silence_prob:
        return utterance
    noise = _noise_fbank(rng.randrange(6))
    lead = rng.randint(config.min_lead_silence_frames, config.max_lead_silence_frames)
    trail = rng.randint(0, config.max_trail_silence_frames)
    start = rng.randrange(len(noise) - lead - trail + 1)
    pieces = [noise[start : start + lead], utterance, noise[start + lead : start + lead + trail]]
    return np.concatenate(pieces)


def augmented_frames(
    frames: np.ndarray, augment: TrainConfig | None, rng: random.Random
) -> np.ndarray:
    """One utterance's fbank frames (float32) with the feature-level augmentations drawn."""
    if augment is None:
        return frames
    if rng.random() < augment.vtlp_prob:
        warp = augment.vtlp_max_warp
        frames = warp_frequencies(frames, rng.uniform(1 - warp, 1 + warp))
    frames = pad_with_silence(frames, augment, rng)
    # After the padding (a microphone colours the silence too); no draw when off, so runs
    # without it keep their random sequence.
    if augment.eq_prob and rng.random() < augment.eq_prob:
        frames = colour_spectrum(frames, random_equaliser(rng, augment.eq_max_db))
    if rng.random() < augment.bandlimit_prob:
        cutoff = rng.uniform(augment.min_cutoff_hz, augment.max_cutoff_hz)
        frames = limit_bandwidth(frames, cutoff, rng.uniform(10.0, 200.0))
    return frames


def make_batch(
    store: FeatureStore,
    indices: list[int],
    cmvn: GlobalCmvn,
    vocabulary: Vocabulary,
    augment: TrainConfig | None,
    rng: random.Random,
) -> Batch:
    """Padded, normalised, augmented rows of the store's utterances `indices` (in pairs, one
    row each, when the batch is drawn as continuous speech: TrainConfig.concat_prob). With
    TrainConfig.consistency_weight the rows come twice, first copies then second copies, each
    copy with its own SpecAugment masks."""
    rows = [[i] for i in indices]
    # No draw when off, so runs without it keep their random sequence.
    if augment is not None and augment.concat_prob and rng.random() < augment.concat_prob:
        rows = [indices[k : k + 2] for k in range(0, len(indices), 2)]
    views = 2 if augment is not None and augment.consistency_weight else 1
    utterances: list[list[Tensor]] = [[] for _ in range(views)]
    for row in rows:
        pieces = [augmented_frames(store.features(i).astype(np.float32), augment, rng) for i in row]
        utterance = torch.from_numpy(cmvn.normalize(np.concatenate(pieces)))
        for copies in utterances:
            copy = utterance.clone() if views > 1 else utterance
            copies.append(copy if augment is None else spec_augment(copy, augment, rng))
    every = [u for copies in utterances for u in copies]
    features = torch.zeros(len(every), max(len(u) for u in every), NUM_MEL_BINS)
    for k, utterance in enumerate(every):
        features[k, : len(utterance)] = utterance
    labels = [vocabulary.encode(" ".join(store.texts[i] for i in row)) for row in rows] * views
    return Batch(
        features,
        torch.tensor([len(u) for u in every]),
        torch.tensor([token for label in labels for token in label]),
        torch.tensor([len(label) for label in labels]),
    )


def ctc_loss(
    model: nn.Module, batch: Batch, chunk: int, left_chunks: int, consistency_weight: float = 0.0
) -> Tensor:
    """Summed CTC loss over the batch divided by its row count (in float32 whatever the model
    computes in: CTC's log-space sums need the range), plus CR-CTC's consistency term for a
    batch made with TrainConfig.consistency_weight."""
    log_probs, out_lengths = model(batch.features, batch.lengths, chunk, left_chunks)
    log_probs = log_probs.float()
    loss = F.ctc_loss(
        log_probs.transpose(0, 1),
        batch.targets,
        out_lengths,
        batch.target_lengths,
        blank=0,
        reduction="sum",
        zero_infinity=True,  # an utterance too fast for its frames must not poison the batch
    )
    if consistency_weight:
        loss = loss + consistency_weight * consistency_loss(log_probs, out_lengths)
    return loss / len(batch.lengths)


def consistency_loss(log_probs: Tensor, out_lengths: Tensor) -> Tensor:
    """CR-CTC's term: summed over the valid frames, KL(p_other || p) for each copy's posteriors
    p, with the other copy's posteriors as a detached target. `log_probs` (2B, T, V) holds the
    first copies, then the second copies, of B rows (make_batch)."""
    first, second = log_probs.detach().chunk(2)
    targets = torch.cat([second, first])
    divergence = F.kl_div(log_probs, targets, reduction="none", log_target=True).sum(-1)
    valid = torch.arange(log_probs.shape[1], device=log_probs.device) < out_lengths[:, None]
    return divergence[valid].sum()


def draw_chunking(config: TrainConfig, rng: random.Random) -> tuple[int, int]:
    """Full context, or a chunk of 1..max_chunk frames with 0..max_left_chunks left (or all)."""
    if rng.random() < config.full_context_prob:
        return 0, -1
    chunk = rng.randint(1, config.max_chunk)
    left = rng.randint(0, config.max_left_chunks)
    return chunk, (-1 if left == config.max_left_chunks else left)


def scheduled_lr(step: int, progress: float, config: TrainConfig) -> float:
    """Linear warm-up over the first steps, then cosine decay to 2% of the peak as `progress`
    goes from 0 to 1: the share of the steps after warm-up done (`train asr`), or of the time
    budget spent (`gpu_recipe`)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    return config.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _lr_at(step: int, total: int, config: TrainConfig) -> float:
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return scheduled_lr(step, progress, config)


@torch.no_grad()
def evaluate(
    model: ConformerCTC,
    store: FeatureStore,
    cmvn: GlobalCmvn,
    vocabulary: Vocabulary,
    chunk: int,
    left_chunks: int,
    limit: int | None = None,
) -> float:
    """Greedy WER of the chunk-masked model over (the first `limit` evenly spaced of) a store,
    computed on the device the model is on."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    indices = list(range(len(store)))
    if limit is not None and len(indices) > limit:
        indices = [indices[int(k * len(store) / limit)] for k in range(limit)]
    references, hypotheses = [], []
    for batch_indices in length_batches([store.lengths[i] for i in indices], 20_000):
        chosen = [indices[k] for k in batch_indices]
        batch = make_batch(store, chosen, cmvn, vocabulary, None, random.Random(0)).to(device)
        log_probs, lengths = model(batch.features, batch.lengths, chunk, left_chunks)
        log_probs, lengths = log_probs.float().cpu(), lengths.cpu()
        for row, i in enumerate(chosen):
            ids = ctc_greedy(log_probs[row, : lengths[row]].numpy())
            hypotheses.append(vocabulary.decode(ids))
            references.append(store.texts[i])
    model.train(was_training)
    return float(jiwer.wer(references, hypotheses))


def _shared_vocabulary(
    kind: str, texts: list[str], out_dir: Path, rank: int, world: int
) -> Vocabulary:
    """The run's vocabulary, learnt once (by rank 0) and kept in out_dir for every rank and
    for resuming."""
    path = out_dir / "vocabulary.json"
    if rank == 0 and not path.exists():
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(make_vocabulary(kind, texts).to_metadata()), "utf-8")
        os.replace(temporary, path)
    if world > 1:
        dist.barrier()
    metadata = json.loads(path.read_text("utf-8"))
    if metadata["vocabulary"] != kind.split("-")[0]:
        raise ValueError(
            f"{out_dir} was trained with a {metadata['vocabulary']} vocabulary, not {kind}"
        )
    return vocabulary_from_metadata(metadata)


ProgressFn = Callable[[dict[str, float]], None]


def _epoch_weights(out_dir: Path, epoch: int) -> Path:
    return out_dir / f"epoch-{epoch}.safetensors"


def _keep_epoch_weights(model: ConformerCTC, out_dir: Path, epoch: int, keep: int) -> None:
    """Write this epoch's weights atomically and delete those that left the averaging window."""
    path = _epoch_weights(out_dir, epoch)
    temporary = path.with_name(f".{path.name}.tmp")
    save_file(
        {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(temporary)
    )
    os.replace(temporary, path)
    for old in out_dir.glob("epoch-*.safetensors"):
        if int(old.stem.split("-")[1]) <= epoch - keep:
            old.unlink()


def average_epoch_weights(out_dir: Path, epochs: list[int]) -> dict[str, Tensor]:
    """The element-wise mean of the given epochs' weights (accumulated in float64)."""
    total: dict[str, Tensor] = {}
    for epoch in epochs:
        for name, value in load_file(str(_epoch_weights(out_dir, epoch))).items():
            total[name] = total.get(name, 0) + value.double()
    return {name: (value / len(epochs)).float() for name, value in total.items()}


def deepened(model: ConformerCTC, extra: int) -> ConformerCTC:
    """`model` with `extra` blocks inserted, spread evenly, each one nearly an identity.

    A new block copies the block before it with its four residual branches' output
    projections zeroed, so it adds nothing, and its final LayerNorm reset to unit scale and
    no shift, so it only normalises. The blocks after it see the same pre-normalised inputs
    (LayerNorm ignores a per-frame scale and shift); only the residual path's scale changes.
    Measured on the run-6 model (dev, 150 utterances, greedy): 8 -> 12 blocks 20.1 -> 20.5%
    WER before any training, 8 -> 16 blocks 22.5%; copying the final norm instead: 26.3, 40.4%.
    """
    count = model.config.num_layers
    after = [-(-count * (k + 1) // extra) - 1 for k in range(extra)]  # insert after these
    blocks: list[nn.Module] = []
    for i, block in enumerate(model.blocks):
        blocks.append(copy.deepcopy(block))  # the model given is left as it was
        for _ in range(after.count(i)):
            new = copy.deepcopy(block)
            for branch in (
                new.ff_first.down,
                new.attention.out,
                new.conv.pointwise_out,
                new.ff_last.down,
            ):
                nn.init.zeros_(branch.weight)
                nn.init.zeros_(branch.bias)
            nn.init.ones_(new.norm.weight)
            nn.init.zeros_(new.norm.bias)
            blocks.append(new)
    grown = ConformerCTC(replace(model.config, num_layers=count + extra))
    grown.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}, strict=False
    )
    grown.blocks = nn.ModuleList(blocks)
    return grown


def train_asr(
    train_manifest: Path | Sequence[Path],
    dev_manifest: Path,
    out_dir: Path,
    model_config: ConformerConfig = ConformerConfig(),
    config: TrainConfig = TrainConfig(),
    progress: ProgressFn | None = None,
    init: Path | None = None,
) -> Path:
    """Train (or resume) into out_dir; returns the final model file (out_dir/model.safetensors).

    `train_manifest`: one manifest or several, whose utterances train together.

    `init`: a model file to start from (its weights, CMVN, vocabulary and shape), to continue
    training a released model or fine-tune it on new data; ignored once out_dir holds a
    checkpoint. With `config.vocabulary` naming another vocabulary than the init model's, its
    encoder is kept and the CTC head starts afresh over the new one: a vocabulary can be
    compared on a trained encoder at the cost of a fine-tune, not of training from scratch.
    `progress` gets a dict per step (epoch, step, steps, loss per target token,
    lr) and per epoch (epoch, dev_wer) on rank 0.
    """
    start = load_model(init) if init is not None else None
    if config.grow_layers and start is None:
        raise ValueError("grow_layers deepens an init model: give one")
    vocabulary_kind, new_head = config.vocabulary or "char", False
    if start is not None:  # its shape (and vocabulary, unless another is named) win
        if config.grow_layers:
            start = replace(start, model=deepened(start.model, config.grow_layers))
        model_config = start.model.config
        kind = start.vocabulary.to_metadata()["vocabulary"]
        own = "char" if kind == "char" else f"bpe-{len(start.vocabulary) - 1}"
        vocabulary_kind = config.vocabulary or own
        new_head = vocabulary_kind != own
    config = replace(config, vocabulary=vocabulary_kind)
    rank, world = distributed_context()
    out_dir.mkdir(parents=True, exist_ok=True)
    train_store, dev_store = _feature_stores(
        train_manifest, dev_manifest, out_dir / "features", rank, world
    )
    cmvn = _shared_cmvn(out_dir / "cmvn.json", start, train_store, rank, world)
    keep_vocabulary = start is not None and not new_head
    if rank == 0 and keep_vocabulary and not (out_dir / "vocabulary.json").exists():
        (out_dir / "vocabulary.json").write_text(json.dumps(start.vocabulary.to_metadata()))
    vocabulary = _shared_vocabulary(vocabulary_kind, train_store.texts, out_dir, rank, world)
    model_config = replace(model_config, vocab_size=len(vocabulary))
    if config.dropout is not None:
        model_config = replace(model_config, dropout=config.dropout)

    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = ConformerCTC(model_config)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    checkpoint = out_dir / "checkpoint.pt"
    epoch, step, history = _restore(checkpoint, model, optimizer, start, new_head)
    trainer: nn.Module = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    dev_wer = functools.partial(
        evaluate,
        model,
        dev_store,
        cmvn,
        vocabulary,
        config.eval_chunk,
        config.eval_left_chunks,
        config.eval_utterances,
    )
    batches = length_batches(train_store.lengths, config.max_frames)
    per_rank = len(batches) // world  # equal counts: DDP needs every rank at every step
    total_steps = per_rank * config.epochs
    while epoch < config.epochs:
        warming = epoch < config.curriculum_epochs
        rng = random.Random(config.seed * 1009 + epoch)  # the same shuffle on every rank
        order = batches if warming else rng.sample(batches, len(batches))
        order = order[: per_rank * world][rank::world]
        augment_rng = random.Random(config.seed * 7919 + epoch * 31 + rank)
        model.train()
        done_in_epoch = step - epoch * per_rank
        for indices in order[done_in_epoch:]:
            augment = None if warming else config
            batch = make_batch(train_store, indices, cmvn, vocabulary, augment, augment_rng)
            chunk_rng = random.Random(config.seed * 104_729 + step)
            chunk, left = (0, -1) if warming else draw_chunking(config, chunk_rng)
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, total_steps, config)
            loss = ctc_loss(trainer, batch, chunk, left, config.consistency_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            step += 1
            if progress is not None and rank == 0:
                per_token = loss.item() * len(batch.lengths) / int(batch.target_lengths.sum())
                progress(
                    {
                        "epoch": epoch,
                        "step": step,
                        "steps": total_steps,
                        "loss": per_token,
                        "lr": optimizer.param_groups[0]["lr"],
                    }
                )
        epoch += 1
        if rank == 0:
            wer = dev_wer()
            history.append({"epoch": epoch, "step": step, "dev_wer": wer})
            if progress is not None:
                progress({"epoch": epoch, "dev_wer": wer})
            _keep_epoch_weights(model, out_dir, epoch, config.average_epochs)
            save_atomic(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "step": step,
                    "history": history,
                    "model_config": model_config.to_dict(),
                    "train_config": asdict(config),
                },
                checkpoint,
            )
        if world > 1:
            dist.barrier()
    final = out_dir / "model.safetensors"
    if rank == 0:
        _average_last_epochs(
            model, out_dir, epoch, config.average_epochs, dev_wer, history, progress
        )
        model.eval()
        save_model(
            final, model, cmvn, vocabulary, {"train_config": asdict(config), "history": history}
        )
    if world > 1:
        dist.barrier()
    return final


def _feature_stores(
    train_manifest: Path | Sequence[Path], dev_manifest: Path, cache: Path, rank: int, world: int
) -> tuple[FeatureStore, FeatureStore]:
    """The train and dev features, computed by rank 0 while the other ranks wait, then read."""
    if rank == 0:
        stores = FeatureStore(train_manifest, cache), FeatureStore(dev_manifest, cache)
    if world > 1:
        dist.barrier()
    if rank != 0:
        stores = FeatureStore(train_manifest, cache), FeatureStore(dev_manifest, cache)
    return stores


def _shared_cmvn(
    path: Path, start: AsrModel | None, train_store: FeatureStore, rank: int, world: int
) -> GlobalCmvn:
    """The run's CMVN, written once by rank 0: the init model's (its inputs must not move), or
    estimated from up to ~2,000 evenly spaced training utterances."""
    if rank == 0 and not path.exists() and start is not None:
        start.cmvn.save(path)
    if rank == 0 and not path.exists():
        sample = range(0, len(train_store), max(1, len(train_store) // 2000))
        GlobalCmvn.from_features(train_store.features(i).astype(np.float32) for i in sample).save(
            path
        )
    if world > 1:
        dist.barrier()
    return GlobalCmvn.load(path)


def _restore(
    checkpoint: Path,
    model: ConformerCTC,
    optimizer: torch.optim.Optimizer,
    start: AsrModel | None,
    new_head: bool,
) -> tuple[int, int, list[dict]]:
    """Resume from the run's checkpoint, else start from the init model's weights (all but the
    CTC head when the vocabulary changes). Returns (epoch, step, history)."""
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        if state["model_config"] != model.config.to_dict():
            raise ValueError(
                f"{checkpoint} was trained with {state['model_config']}, not these settings"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return state["epoch"], state["step"], state["history"]
    if start is not None:
        weights = start.model.state_dict()
        if new_head:  # the encoder carries over; the head keeps its fresh initialisation
            weights = {k: v for k, v in weights.items() if not k.startswith("head.")}
        missing, unexpected = model.load_state_dict(weights, strict=not new_head)
        assert not unexpected and all(name.startswith("head.") for name in missing)
    return 0, 0, []


def _average_last_epochs(
    model: ConformerCTC,
    out_dir: Path,
    epoch: int,
    window: int,
    dev_wer: Callable[[], float],
    history: list[dict],
    progress: ProgressFn | None,
) -> None:
    """Load the mean of the last `window` epochs' kept weights into `model` (when there are
    two or more) and log its dev WER."""
    averaged = [e for e in range(epoch - window + 1, epoch + 1) if e >= 1]
    averaged = [e for e in averaged if _epoch_weights(out_dir, e).exists()]
    if len(averaged) > 1:
        model.load_state_dict(average_epoch_weights(out_dir, averaged))
        wer = dev_wer()
        history.append({"averaged_epochs": averaged, "dev_wer": wer})
        if progress is not None:
            progress({"epoch": epoch, "averaged_dev_wer": wer})
