"""`bench live`: utterances played into `transcribe -` at real time, delays timed per line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from edgestream.bench.asr import Utterance
from edgestream.bench.live import (
    Played,
    conversation_events,
    live_report,
    transcript_events,
    wav_stream_header,
)
from edgestream.cli import app
from tests.asr.conftest import SAMPLE

runner = CliRunner()


def test_the_stream_header_is_what_a_recorder_writes() -> None:
    header = wav_stream_header()
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert header[4:8] == header[40:44] == b"\xff\xff\xff\xff"  # length unknown


def test_each_utterance_gets_the_first_segment_after_it_and_before_the_next(
    tmp_path: Path,
) -> None:
    utterances = [Utterance(tmp_path / f"{i}.wav", text, "all") for i, text in enumerate("ab")]
    played = [Played(10.0, 12.0), Played(14.0, 16.0)]
    lines = [
        (10.5, {"audio": "-", "partial": "a"}),
        (13.4, {"audio": "-", "segment": "a"}),
        (13.9, {"audio": "-", "segment": "stray"}),  # a second segment for the first utterance
        (14.8, {"audio": "-", "partial": "b"}),
        (17.0, {"audio": "-", "segment": "b"}),
        (17.1, {"audio": "-", "text": "a stray b", "rtf": 0.05}),
    ]
    report = live_report(utterances, played, lines)
    assert [r["segment_delay_s"] for r in report["rows"]] == [1.4, 1.0]
    assert report["start_offset_s"] is None  # these segments do not say where they were heard
    assert [r["first_words_s"] for r in report["rows"]] == [0.5, 0.8]
    assert report["segments"] == 3 and report["wer"] == pytest.approx(0.5)
    assert report["segment_delay_s"]["max"] == 1.4


def test_output_pieces_become_events_at_the_time_their_line_ends() -> None:
    lines = b'{"audio": "-", "partial": "wh"}\n{"audio": "-", "segment": "why"}\n'
    chunks = [(1.0, lines[:10]), (2.0, lines[10:40]), (3.0, lines[40:])]
    assert transcript_events(chunks) == [
        (2.0, {"audio": "-", "partial": "wh"}),
        (3.0, {"audio": "-", "segment": "why"}),
    ]
    talk = "you: why is the sky blue\nassistant: The sky\n\nis blue. \u00e9\nyou: and the sea\n"
    raw = talk.encode() + b"assistant:  It"
    cut = raw.index("\u00e9".encode()) + 1  # a character split between two reads
    chunks = [(1.0, raw[:24]), (1.5, raw[24:40]), (2.0, raw[40:cut]), (3.0, raw[cut:])]
    assert conversation_events(chunks) == [
        (1.5, {"segment": "why is the sky blue"}),
        (1.5, {"answer": True}),
        (3.0, {"segment": "and the sea"}),
        (3.0, {"answer": True}),
    ]


def test_where_a_segment_was_heard_is_checked_against_the_speech(tmp_path: Path) -> None:
    utterances = [Utterance(tmp_path / "0.wav", "why", "all")]
    played = [Played(10.0, 11.0, speech_at=(5.25, 6.5))]
    events = [(12.0, {"segment": "why", "start": 5.5, "end": 6.5})]
    row = live_report(utterances, played, events)["rows"][0]
    assert row["start_offset_s"] == 0.25 and row["end_offset_s"] == 0.0


def test_answer_delays_are_reported_where_there_are_answers(tmp_path: Path) -> None:
    utterances = [Utterance(tmp_path / "0.wav", "why", "all")]
    events = [(12.0, {"segment": "why"}), (12.7, {"answer": True})]
    report = live_report(utterances, [Played(10.0, 11.0)], events)
    assert report["rows"][0]["answer_delay_s"] == 1.7 and report["rtf"] is None
    assert report["wer"] == 0.0 and report["answer_delay_s"]["mean"] == 1.7


def test_the_bundled_model_live(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    line = json.dumps({"audio": str(SAMPLE), "text": "Why is the sky blue?"})
    manifest.write_text(f"{line}\n{line}\n")
    out = tmp_path / "live.json"
    done = runner.invoke(
        app, ["bench", "live", "--manifest", str(manifest), "--pause", "1.5", "--json", str(out)]
    )
    assert done.exit_code == 0, done.output
    report = json.loads(out.read_text())
    assert report["segments"] == 2 and report["wer"] == 0.0
    assert (report["model"], report["threads"], report["pause_s"]) == ("default", 1, 1.5)
    seconds = len(sf.read(SAMPLE)[0]) / 16_000
    for row in report["rows"]:
        assert seconds - 1 < row["speech_s"] < seconds  # the VAD trims the silence at the ends
        # an endpoint waits for 1.2 s of blanks, then for the chunk that holds them to end
        assert 0.5 < row["segment_delay_s"] < 3.0 and 0.2 < row["first_words_s"] < 3.0
        assert -0.1 < row["start_offset_s"] < 0.4 and -0.1 < row["end_offset_s"] < 0.3
    assert np.isfinite(report["rtf"]) and report["rtf"] < 1


def test_a_pause_too_short_for_an_endpoint_is_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio": str(SAMPLE), "text": "why"}) + "\n")
    done = runner.invoke(app, ["bench", "live", "--manifest", str(manifest), "--pause", "1"])
    assert done.exit_code == 2 and "at least 1.5 s" in done.output


def test_what_the_program_under_test_refuses_is_reported(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio": str(SAMPLE), "text": "why"}) + "\n")
    done = runner.invoke(app, ["bench", "live", "--manifest", str(manifest), "--model", "nope"])
    assert done.exit_code == 2 and "unknown ASR model 'nope'" in done.output
    assert "Traceback" not in done.output
