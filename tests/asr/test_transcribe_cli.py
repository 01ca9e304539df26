"""`edgestream transcribe` and `edgestream bench asr`: outputs, JSON keys and bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from edgestream.asr.lm import load_lm, train_ngram, write_arpa
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.transcribe import transcribe_file, transcribe_samples
from edgestream.bench.asr import normalize_text
from edgestream.cli import LM_BEAM, app
from tests.asr.conftest import SAMPLE, wav_stream

runner = CliRunner()


def _first_audio(corpus: Path) -> Path:
    return corpus / read_manifest(corpus / "dev.jsonl")[0].audio


def test_transcribe_file_matches_one_piece_streaming(random_model: Path, tiny_corpus: Path) -> None:
    asr, audio = load_model(random_model), _first_audio(tiny_corpus)
    partials: list[str] = []
    result = transcribe_file(asr, audio, StreamingOptions(), partials.append)
    samples = sf.read(audio, dtype="float32")[0]
    assert result.text == transcribe_samples(asr, samples, StreamingOptions())
    assert partials and partials[-1] == result.text
    assert result.duration == pytest.approx(len(samples) / 16_000)
    assert 0 < result.rtf < 5 and result.first_partial_ms is not None


def test_cli_json_lines_and_streamed_partials(random_model: Path, tiny_corpus: Path) -> None:
    audio = _first_audio(tiny_corpus)
    plain = runner.invoke(app, ["transcribe", str(audio), "--model", str(random_model), "--json"])
    assert plain.exit_code == 0, plain.output
    final = json.loads(plain.stdout.strip())
    assert set(final) == {"audio", "text", "duration", "rtf", "first_partial_ms"}
    streamed = runner.invoke(
        app, ["transcribe", str(audio), "--model", str(random_model), "--json", "--stream"]
    )
    lines = [json.loads(line) for line in streamed.stdout.strip().splitlines()]
    assert len(lines) >= 2 and all(set(line) == {"audio", "partial"} for line in lines[:-1])
    assert lines[-1]["text"] == final["text"] == lines[-2]["partial"]


def test_streamed_partials_in_a_log_are_plain_lines(random_model: Path, tiny_corpus: Path) -> None:
    # stderr here is not a terminal (as in a log file or a pipe): no escape codes, one
    # partial per line, and the final text alone on stdout.
    audio = _first_audio(tiny_corpus)
    result = runner.invoke(
        app, ["transcribe", str(audio), "--model", str(random_model), "--stream"]
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stderr and "\r" not in result.stderr
    partials = result.stderr.splitlines()
    assert partials and partials[-1] == result.stdout.strip()


def test_cli_reports_each_bad_file_and_still_transcribes_the_good_ones(
    random_model: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    good = _first_audio(tiny_corpus)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    stereo_8k = tmp_path / "stereo8k.wav"
    samples = sf.read(good, dtype="float32")[0]
    sf.write(stereo_8k, np.stack([samples[::2]] * 2, axis=1), 8_000)
    result = runner.invoke(
        app,
        [
            "transcribe",
            str(tmp_path / "missing.wav"),
            str(corrupt),
            str(good),
            str(stereo_8k),
            "--model",
            str(random_model),
            "--json",
        ],
    )
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "no such file" in errors[0] and "corrupt.wav" in errors[1]
    assert "Traceback" not in result.output
    transcribed = [json.loads(line)["audio"] for line in result.stdout.strip().splitlines()]
    assert transcribed == [str(good), str(stereo_8k)]


def test_cli_refuses_an_unknown_model_and_bad_options(tiny_corpus: Path, tmp_path: Path) -> None:
    audio = str(_first_audio(tiny_corpus))
    unknown = runner.invoke(app, ["transcribe", audio, "--model", "whisper-large"])
    assert unknown.exit_code == 2 and "unknown ASR model 'whisper-large'" in unknown.stderr
    not_a_model = tmp_path / "model.safetensors"
    not_a_model.write_bytes(b"garbage")
    corrupt = runner.invoke(app, ["transcribe", audio, "--model", str(not_a_model)])
    assert corrupt.exit_code == 2 and "not a readable safetensors file" in corrupt.stderr
    chunk = runner.invoke(app, ["transcribe", audio, "--chunk-ms", "100"])
    assert chunk.exit_code == 2 and "chunk" in chunk.stderr
    missing_lm = runner.invoke(app, ["transcribe", audio, "--lm", str(tmp_path / "no.arpa")])
    assert missing_lm.exit_code == 2 and "no.arpa does not exist" in missing_lm.stderr
    endpoint = runner.invoke(app, ["transcribe", audio, "--endpoint-silence", "0"])
    assert endpoint.exit_code == 2 and "--endpoint-silence must be positive" in endpoint.stderr


def test_cli_language_model_choices(random_model: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    audio, model = str(_first_audio(tiny_corpus)), str(random_model)

    def text(*options: str) -> str:
        done = runner.invoke(app, ["transcribe", audio, "--model", model, "--json", *options])
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)["text"]

    asr = load_model(random_model)
    greedy = transcribe_file(asr, _first_audio(tiny_corpus), StreamingOptions()).text
    assert text("--lm", "none") == text("--beam", "0") == greedy
    lm_file = tmp_path / "lm.arpa"
    write_arpa(train_ngram(["the cat sat on the mat", "a dog ran"]), lm_file)
    with_lm = StreamingOptions(beam=LM_BEAM, lm=load_lm(lm_file))
    expected = transcribe_file(asr, _first_audio(tiny_corpus), with_lm).text
    assert text("--lm", str(lm_file)) == expected


def test_bench_asr_writes_the_report(random_model: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "asr.json"
    result = runner.invoke(
        app,
        [
            "bench",
            "asr",
            "--manifest",
            str(tiny_corpus / "test.jsonl"),
            "--model",
            str(random_model),
            "--json",
            str(out),
            "--hypotheses",
            str(tmp_path / "hypotheses.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    keys = {"wer", "cer", "rtf", "rtf_2threads", "utterances", "audio_seconds"}
    assert set(report["overall"]) == keys
    assert report["endpoint_silence_s"] == StreamingOptions.silence_after_text_s
    assert set(report["groups"]) == {"espeak-seen", "espeak-unseen"}
    assert all(set(row) == keys for row in report["groups"].values())
    assert report["overall"]["wer"] > 0.5  # random weights cannot transcribe
    assert report["overall"]["cer"] > 0.3
    lines = [json.loads(line) for line in (tmp_path / "hypotheses.jsonl").read_text().splitlines()]
    manifest = (tiny_corpus / "test.jsonl").read_text().splitlines()
    assert len(lines) == len(manifest) == report["overall"]["utterances"]
    first = json.loads(manifest[0])
    assert lines[0]["reference"] == normalize_text(first["text"])
    assert lines[0]["group"] == first["group"]
    assert {"audio", "hypothesis", "wer"} <= set(lines[0])
    sphinx = report["pocketsphinx"]
    assert "note" in sphinx or set(sphinx["overall"]) == keys - {"rtf_2threads"}


def test_bench_asr_continuous_scores_streams_of_the_utterances(
    random_model: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    out, hypotheses = tmp_path / "asr.json", tmp_path / "hypotheses.jsonl"
    manifest = tiny_corpus / "train.jsonl"  # the set with more than one utterance per group
    arguments = ["--manifest", str(manifest), "--model", str(random_model), "--json", str(out)]
    result = runner.invoke(
        app,
        [
            "bench",
            "asr",
            *arguments,
            "--continuous",
            "0.5",
            "--endpoint-silence",
            "0.9",
            "--hypotheses",
            str(hypotheses),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["endpoint_silence_s"] == 0.9  # what it measured with, recorded
    entries = read_manifest(manifest)
    assert report["continuous"]["source_utterances"] == len(entries)
    lines = [json.loads(line) for line in hypotheses.read_text().splitlines()]
    assert len(lines) == report["overall"]["utterances"] < len(entries)
    # Every utterance's words are in exactly one stream, in manifest order within its group.
    assert sum(line["audio"].count(" + ") + 1 for line in lines) == len(entries)
    joined = " ".join(line["reference"] for line in lines if line["group"] == entries[0].group)
    same_group = [e.text for e in entries if e.group == entries[0].group]
    assert joined == normalize_text(" ".join(same_group))
    assert report["overall"]["audio_seconds"] > sum(e.duration for e in entries)  # the pauses
    assert "note" in report["pocketsphinx"]


def test_a_set_stop_ends_the_stream_after_the_piece_in_hand(
    random_model: Path, tiny_corpus: Path
) -> None:
    stop = threading.Event()
    stop.set()
    result = transcribe_file(load_model(random_model), _first_audio(tiny_corpus), stop=stop)
    assert result.interrupted and result.duration == pytest.approx(0.1)
    whole = transcribe_file(load_model(random_model), _first_audio(tiny_corpus))
    assert not whole.interrupted and whole.duration > 1


def test_live_segments_are_handed_over_once_and_make_up_the_text(tmp_path: Path) -> None:
    twice = tmp_path / "twice.wav"
    sf.write(twice, np.concatenate([_with_pause(1.5), _with_pause(0.5)]), 16_000)
    asr, segments, partials = load_model("default"), [], []
    result = transcribe_file(asr, twice, StreamingOptions(), partials.append, segments.append)
    texts = [segment.text for segment in segments]
    assert texts == ["why is the sky blue"] * 2 and tuple(texts) == result.segments
    assert " ".join(texts) == result.text == transcribe_file(asr, twice).text
    # Partials hold the open segment only (greedy: each a prefix of the segment it opens).
    assert partials and all(texts[0].startswith(partial) for partial in partials)
    # Where each was heard: the sample's speech, by Silero VAD 0.35-1.73 s of its 2.12 s
    # (CTC's spikes come a little after the sounds), and the second time 3.62 s later.
    first, second = segments
    assert 0.35 <= first.start_s <= 0.35 + 0.3 and 1.73 <= first.end_s <= 1.73 + 0.2
    assert second.start_s - first.start_s == pytest.approx(3.62, abs=0.1)
    assert second.end_s - first.end_s == pytest.approx(3.62, abs=0.1)


def _with_pause(seconds: float) -> np.ndarray:
    samples = sf.read(SAMPLE, dtype="float32")[0]
    return np.concatenate([samples, np.zeros(int(seconds * 16_000), np.float32)])


def _transcribe_process(*args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "edgestream", "transcribe", "--threads", "1", *args]
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_a_live_pipe_prints_each_segment_as_it_closes(tmp_path: Path) -> None:
    # The bundled model hears the sample twice, 1.5 s apart, from a real pipe (a WAV stream of
    # unknown length, as arecord writes it) and from the same audio as a file, in one process.
    twice = np.concatenate([_with_pause(1.5), _with_pause(0.5)])
    as_file = tmp_path / "twice.wav"
    sf.write(as_file, twice, 16_000)
    process = _transcribe_process(str(as_file), "-", "--json")
    out, err = process.communicate(wav_stream(twice, 16_000), timeout=120)
    assert process.returncode == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    from_file, *segments, live = lines
    assert [line["segment"] for line in segments] == ["why is the sky blue"] * 2
    assert live["audio"] == "-" and live["text"] == from_file["text"] == " ".join(
        ["why is the sky blue"] * 2
    )
    assert live["duration"] == pytest.approx(len(twice) / 16_000, abs=0.01)


def test_ctrl_c_ends_a_live_stream_with_its_text_so_far() -> None:
    process = _transcribe_process("-", "--json", "--stream")
    assert process.stdin is not None and process.stdout is not None
    stopped = threading.Event()

    def record() -> None:  # a recorder that never stops by itself, at ten times real time
        try:
            process.stdin.write(wav_stream(_with_pause(0.1), 16_000))
            while not stopped.is_set():
                process.stdin.write(np.zeros(1600, np.int16).tobytes())
                process.stdin.flush()
                time.sleep(0.01)
        except (BrokenPipeError, ValueError):
            pass  # the recognizer has gone

    recorder = threading.Thread(target=record)
    recorder.start()
    try:
        first = json.loads(process.stdout.readline())
        assert first["partial"].startswith("why")
        process.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in process.stdout.read().decode().splitlines()]
        assert process.wait(timeout=60) == 130
    finally:
        stopped.set()
        recorder.join()
    assert "Traceback" not in process.stderr.read().decode()
    *_, segment, final = [first, *rest]  # what was heard before Ctrl-C, closed and reported
    assert final["audio"] == "-" and final["text"].startswith("why")
    assert segment["audio"] == "-" and segment["segment"] == final["text"]
    assert 0 <= segment["start"] < segment["end"] <= final["duration"]


def test_cli_refuses_what_is_not_a_live_stream(random_model: Path) -> None:
    model = ["--model", str(random_model)]
    junk = runner.invoke(app, ["transcribe", "-", *model], input=b"not audio at all " * 10)
    assert junk.exit_code == 2 and "error: standard input: not an audio stream" in junk.stderr
    assert "Traceback" not in junk.output
    twice = runner.invoke(app, ["transcribe", "-", "-", *model], input=b"")
    assert twice.exit_code == 2 and "only once" in twice.stderr
