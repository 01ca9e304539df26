"""The assistant: spoken question -> streaming transcript -> answer, in Python and on the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from edgestream.asr.lm import load_lm
from edgestream.asr.streaming import StreamingOptions
from edgestream.asr.transcribe import transcribe_file
from edgestream.assist.pipeline import Assistant, AssistantConfig
from edgestream.assist.rescore import LlmRescorer
from edgestream.cli import LM_BEAM, app
from tests.asr.conftest import wav_stream
from tests.conftest import needs_smollm2

runner = CliRunner()
SAMPLE = Path(__file__).parents[2] / "edgestream/asr/samples/why-is-the-sky-blue.wav"


@pytest.mark.parametrize("method", ["ss-pld", "ss"])
def test_ss_answers_are_token_identical_to_ar(assistant: Assistant, method: str) -> None:
    for question in ("why is the sky blue", "tell me about a dog", "where do penguins live"):
        answer = assistant.answer(question, method, compare=True)
        assert answer.method == method and answer.identical_to_ar is True, question
        assert answer.baseline is not None and answer.result.token_ids == answer.baseline.token_ids
        assert answer.speedup is not None and answer.speedup > 0
        assert answer.text == assistant.lm.decode(answer.result.token_ids)


def test_tokens_reach_the_callback_as_they_are_decoded(assistant: Assistant) -> None:
    seen: list[int] = []
    answer = assistant.answer("how do i boil an egg", "ss", seen.append, max_new_tokens=10)
    assert seen == answer.result.token_ids and 0 < len(seen) <= 10


def test_ss_and_ss_pld_share_one_merged_copy_of_the_streams(
    assistant: Assistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each merge copies the stream layers (~150 MB for SmolLM2's): the two methods share one.
    from edgestream.llm.msa import SpeculativeStreams

    merges = []
    merge = SpeculativeStreams.merged_for
    monkeypatch.setattr(
        SpeculativeStreams, "merged_for", lambda self, *a: merges.append(1) or merge(self, *a)
    )
    fresh = Assistant(assistant.asr, assistant.lm, replace(assistant.config))
    assert fresh.methods() == ["ss-pld", "ss", "ar"] and len(merges) == 1
    assert fresh.answer("hi", max_new_tokens=8).method == "ss-pld"  # the default


def test_methods_without_stream_weights_leave_only_ar(
    assistant: Assistant, tiny_model_dir: Path
) -> None:
    """A local model has no bundled streams: ss is not offered, and asking for it says why."""
    plain = Assistant(assistant.asr, assistant.lm, AssistantConfig(llm=str(tiny_model_dir)))
    assert plain.methods() == ["ar"]
    with pytest.raises(ValueError, match="no bundled streams"):
        plain.answer("hi", "ss")
    with pytest.raises(ValueError, match="unknown method 'pld'"):
        plain.answer("hi", "pld")


def _assist(args: list[str], tiny_model_dir: Path, tiny_streams: Path) -> object:
    return runner.invoke(
        app, ["assist", *args, "--llm", str(tiny_model_dir), "--streams", str(tiny_streams)]
    )


def test_assist_json_reports_transcript_answer_and_speed(
    assistant: Assistant, spoken_questions: list[Path], tiny_model_dir: Path, tiny_streams: Path
) -> None:
    clip = spoken_questions[5]
    models = (tiny_model_dir, tiny_streams)
    result = _assist([str(clip), "--json", "--max-new-tokens", "24"], *models)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    # The CLI decodes with the bundled word LM ("france", where greedy hears "fronce"), then
    # rescores the candidates with the answering model, here the tiny random one.
    with_lm = StreamingOptions(beam=LM_BEAM, lm=load_lm("default"))
    rescored = replace(with_lm, rescorer=LlmRescorer(assistant.lm))
    heard = transcribe_file(assistant.asr, clip, rescored).text
    assert record["transcript"]["text"] == heard != ""
    plain = _assist([str(clip), "--json", "--max-new-tokens", "1", "--no-rescore"], *models)
    assert (
        json.loads(plain.stdout)["transcript"]["text"]
        == transcribe_file(assistant.asr, clip, with_lm).text
    )
    assert record["transcript"]["rtf"] > 0 and record["transcript"]["duration"] > 0
    answer = record["answer"]
    assert answer["method"] == "ss-pld" and answer["identical_to_ar"] is True
    assert answer["text"] == assistant.answer(heard, "ar", max_new_tokens=24).text
    assert answer["speedup"] > 0 and answer["mean_accepted"] >= 1


def test_assist_prints_the_conversation_then_the_speed(
    spoken_questions: list[Path], tiny_model_dir: Path, tiny_streams: Path
) -> None:
    result = _assist([str(spoken_questions[6]), "--method", "ar"], tiny_model_dir, tiny_streams)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("you: ") and lines[1].startswith("assistant: ")
    assert "RTF" in result.stderr and "tokens/s" in result.stderr


def test_assist_bad_input(tmp_path: Path, tiny_model_dir: Path, tiny_streams: Path) -> None:
    silence = tmp_path / "silence.wav"
    sf.write(silence, np.zeros(16_000 * 2, np.float32), 16_000)
    noise = tmp_path / "noise.wav"
    hiss = np.random.default_rng(0).standard_normal(16_000 * 3) * 0.003
    sf.write(noise, hiss.astype(np.float32), 16_000)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 10)
    cases = [
        ([str(tmp_path / "missing.wav")], "no such audio file"),
        ([str(silence)], "no speech recognised"),
        ([str(noise)], "no speech recognised"),
        ([str(corrupt)], "corrupt.wav"),
        ([str(SAMPLE), "--method", "pld"], "unknown method 'pld'"),
        ([str(SAMPLE), "--max-new-tokens", "0"], "max_new_tokens must be at least 1"),
        ([str(SAMPLE), "--chunk-ms", "50"], "multiple of 40 ms"),
        ([str(SAMPLE), "--endpoint-silence", "0"], "--endpoint-silence must be positive"),
        ([str(SAMPLE), "--dtype", "int4"], "unknown dtype 'int4'"),
    ]
    for args, message in cases:
        result = _assist(args, tiny_model_dir, tiny_streams)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])
    assert corrupt.read_bytes().startswith(b"RIFF")  # nothing the user gave is touched


@needs_smollm2
def test_the_demo_question_is_answered_by_smollm2_with_ss() -> None:
    """`make demo`'s assist step: the bundled recording, SmolLM2, the bundled streams."""
    result = runner.invoke(app, ["assist", str(SAMPLE), "--json", "--max-new-tokens", "32"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["transcript"]["text"].startswith("why is the")
    assert record["answer"]["identical_to_ar"] is True
    assert record["answer"]["mean_accepted"] > 1.2  # trained streams do get drafts accepted


def _two_questions(spoken_questions: list[Path], tmp_path: Path) -> tuple[bytes, Path]:
    """Two spoken questions 1.5 s apart, as a recorder's WAV stream and as a file."""
    pause = np.zeros(24_000, np.float32)
    clips = [sf.read(spoken_questions[i], dtype="float32")[0] for i in (1, 5)]
    samples = np.concatenate([clips[0], pause, clips[1], pause])
    sf.write(tmp_path / "two.wav", samples, 16_000)
    return wav_stream(samples, 16_000), tmp_path / "two.wav"


def test_assist_live_answers_each_question_as_its_speaker_pauses(
    assistant: Assistant,
    spoken_questions: list[Path],
    tiny_model_dir: Path,
    tiny_streams: Path,
    tmp_path: Path,
) -> None:
    stream, as_file = _two_questions(spoken_questions, tmp_path)
    options = StreamingOptions(beam=LM_BEAM, lm=load_lm("default"))
    heard: list[str] = []
    transcribe_file(assistant.asr, as_file, options, on_segment=heard.append)
    assert len(heard) == 2
    args = ["assist", "-", "--llm", str(tiny_model_dir), "--streams", str(tiny_streams)]
    args += ["--json", "--max-new-tokens", "12", "--no-rescore"]
    result = runner.invoke(app, args, input=stream)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    spans = [
        {"audio": "-", "text": h.text, "start": round(h.start_s, 2), "end": round(h.end_s, 2)}
        for h in heard
    ]
    assert [r["transcript"] for r in records] == spans
    for record, question in zip(records, heard, strict=True):
        expected = assistant.answer(question.text, "ar", max_new_tokens=12).text
        assert record["answer"]["text"] == expected and record["answer"]["method"] == "ss-pld"
        assert "speedup" not in record["answer"]  # live: no second decode unless --compare
    talk = runner.invoke(app, [*args[:-4], "--max-new-tokens", "4", "--compare"], input=stream)
    assert talk.exit_code == 0, talk.output
    you = [line for line in talk.stdout.splitlines() if line.startswith("you: ")]
    assert len(you) == 2 and talk.stderr.count("output identical") == 2
