"""Adapting the language model to transcript text: records, the `train rescorer` command, the
adapter in `--rescore`, and the bundled adapter against the plain SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from edgestream.assist.rescore import load_rescorer, rescoring_adapter
from edgestream.assist.transcript_lm import (
    DEFAULT_ADAPTER,
    MAX_SENTENCE_TOKENS,
    nats_per_token,
    transcript_records,
)
from edgestream.cli import app
from edgestream.llm.loading import load_language_model
from edgestream.llm.score import document_start_id, text_log_probs
from tests.conftest import needs_shared_data, needs_smollm2

SENTENCES = (
    "the cat sat on the mat",
    "a dog ran to the park",
    "we paid two hundred dollars for the room",
    "the train leaves at nine in the morning",
)


def test_records_are_documents_scored_from_their_first_token(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    start = document_start_id(lm)
    long_sentence = " ".join(["word"] * 200)
    records = transcript_records(lm, [SENTENCES[0], long_sentence])
    ids = lm.tokenizer.encode(SENTENCES[0], add_special_tokens=False)
    assert records[0]["tokens"].tolist() == [start, *ids, start]
    assert records[0]["prompt_length"] == 1  # the loss covers every token after the first
    assert len(records[1]["tokens"]) == MAX_SENTENCE_TOKENS + 2
    # lines of several joined sentences (continuous speech's segments) may keep more
    joined = transcript_records(lm, [long_sentence], max_tokens=150)
    assert len(joined[0]["tokens"]) == 150 + 2
    assert joined[0]["tokens"][-1] == start
    with pytest.raises(ValueError, match="no sentences"):
        transcript_records(lm, [])
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        transcript_records(lm, SENTENCES, max_tokens=0)


def test_nats_per_token_is_the_mean_of_the_scored_tokens(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir))
    texts = list(SENTENCES[:3])
    tokens = sum(len(lm.tokenizer.encode(t, add_special_tokens=False)) + 1 for t in texts)
    expected = -sum(text_log_probs(lm, texts)) / tokens
    assert nats_per_token(lm, texts, group=2) == pytest.approx(expected, rel=1e-5)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`train rescorer` on 200 lines of four sentences (written with capitals and stops, which
    the command normalises away): the run folder."""
    tmp_path = tmp_path_factory.mktemp("rescorer")
    text = tmp_path / "transcripts.txt"
    text.write_text("\n".join(f"{SENTENCES[i % 4].capitalize()}." for i in range(200)) + "\n")
    out = tmp_path / "run"
    args = ["train", "rescorer", "--model", str(tiny_model_dir), "--text", str(text)]
    args += ["--out", str(out), "--steps", "20", "--batch", "8", "--lr", "1e-2", "--warmup", "2"]
    args += ["--lora-rank", "4", "--held-out", "4", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "held-out perplexity (4 sentences)" in result.stderr
    return out


def test_train_rescorer_lowers_held_out_loss_and_the_adapter_rescores(
    trained: Path, tiny_model_dir: Path, spoken_questions: list[Path]
) -> None:
    adapter = trained / "adapter.safetensors"
    with safe_open(str(adapter), framework="pt") as f:
        info = json.loads(f.metadata()["info"])
    before, after = info["held_out_nats_per_token"]
    assert info["sentences"] == 196 and info["held_out_sentences"] == 4
    assert info["max_tokens"] == MAX_SENTENCE_TOKENS
    assert after < before - 0.5  # four sentences, each seen about 40 times: learnt

    plain = load_rescorer(str(tiny_model_dir), adapter="none")
    adapted = load_rescorer(str(tiny_model_dir), adapter=str(adapter))
    assert plain.adapter is None and adapted.adapter == "adapter.safetensors"
    assert "adapter.safetensors" in str(adapted)
    scores = [text_log_probs(r.lm, [SENTENCES[1]])[0] for r in (plain, adapted)]
    assert scores[1] > scores[0] + 1.0  # the adapter knows the sentence far better

    runner = CliRunner()
    audio = str(spoken_questions[0])
    command = ["transcribe", audio, "--rescore", str(tiny_model_dir), "--json"]
    rescored = runner.invoke(app, [*command, "--rescore-adapter", str(adapter)])
    assert rescored.exit_code == 0, rescored.output
    assert json.loads(rescored.stdout)["text"]
    missing = runner.invoke(app, [*command, "--rescore-adapter", str(trained / "none.st")])
    assert missing.exit_code == 2 and "no rescoring adapter at" in missing.stderr
    text_file = str(trained.parent / "transcripts.txt")
    not_adapter = runner.invoke(app, [*command, "--rescore-adapter", text_file])
    assert not_adapter.exit_code == 2 and "is not an adapter file" in not_adapter.stderr


def test_train_rescorer_continues_from_an_adapter(trained: Path, tiny_model_dir: Path) -> None:
    """--init-adapter starts where the earlier run stopped: with a learning rate too small to
    move anything, the continued adapter reads the held-out sentences as well as its start
    did, which a run from zero could not; the start's rank 4 replaces the default 16."""
    start = trained / "adapter.safetensors"
    out = trained.parent / "continued"
    text = str(trained.parent / "transcripts.txt")
    args = ["train", "rescorer", "--model", str(tiny_model_dir), "--text", text, "--out", str(out)]
    args += ["--steps", "1", "--batch", "2", "--lr", "1e-9", "--warmup", "1", "--held-out", "4"]
    result = CliRunner().invoke(app, [*args, "--init-adapter", str(start), "--threads", "1"])
    assert result.exit_code == 0, result.output
    infos = []
    for path in (start, out / "adapter.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            infos.append(json.loads(f.metadata()["info"]))
            assert json.loads(f.metadata()["lora_config"])["rank"] == 4
    assert infos[1]["init_adapter"] == str(start) and infos[0]["init_adapter"] is None
    before, after = infos[1]["held_out_nats_per_token"]
    assert after < before - 0.5
    assert after == pytest.approx(infos[0]["held_out_nats_per_token"][1], abs=1e-3)

    missing = CliRunner().invoke(app, [*args, "--init-adapter", str(trained / "none.st")])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_the_assistant_rescores_with_an_adapted_copy_and_answers_with_the_base(
    trained: Path, tiny_model_dir: Path, tiny_streams: Path
) -> None:
    from edgestream.asr.lm import load_lm
    from edgestream.asr.streaming import StreamingOptions
    from edgestream.assist.pipeline import Assistant, AssistantConfig

    streaming = StreamingOptions(beam=8, lm=load_lm("default"))
    common = {"llm": str(tiny_model_dir), "streams_path": tiny_streams, "streaming": streaming}
    own = Assistant.load(AssistantConfig(**common))
    copy = Assistant.load(
        AssistantConfig(**common, rescore_adapter=str(trained / "adapter.safetensors"))
    )
    assert own.streaming.rescorer.lm is own.lm and own.streaming.rescorer.adapter is None
    assert copy.streaming.rescorer.lm is not copy.lm
    assert copy.streaming.rescorer.adapter == "adapter.safetensors"
    question = "where do penguins live"
    for method in ("ar", "ss"):
        answers = [a.answer(question, method, max_new_tokens=12) for a in (own, copy)]
        assert answers[0].result.token_ids == answers[1].result.token_ids, method


def test_under_q4_1_the_adapted_rescoring_copy_stays_float32(
    trained: Path, tiny_model_dir: Path
) -> None:
    from edgestream.asr.lm import load_lm
    from edgestream.asr.streaming import StreamingOptions
    from edgestream.assist.pipeline import Assistant, AssistantConfig
    from edgestream.llm.int4 import Int4Linear, int4_available

    if not int4_available():
        pytest.skip("no int4 CPU kernel in this PyTorch")
    config = AssistantConfig(
        llm=str(tiny_model_dir),
        dtype="q4_1",
        streaming=StreamingOptions(beam=8, lm=load_lm("default")),
        rescore_adapter=str(trained / "adapter.safetensors"),
    )
    assistant = Assistant.load(config)
    is_4bit = [isinstance(b.feed_forward.w_down, Int4Linear) for b in assistant.lm.model.layers]
    copy = assistant.streaming.rescorer.lm.model
    assert all(is_4bit) and not any(
        isinstance(b.feed_forward.w_down, Int4Linear) for b in copy.layers
    )
    assert assistant.answer("where do penguins live", "ar", max_new_tokens=6).result.token_ids


def test_the_bundled_adapter_is_only_the_default_models() -> None:
    assert rescoring_adapter("smollm2", "default") == DEFAULT_ADAPTER
    assert rescoring_adapter("some/other-model", "default") is None
    assert rescoring_adapter("smollm2", "none") is None


@needs_smollm2
@needs_shared_data
def test_bundled_adapter_reads_held_out_transcripts_better_than_plain_smollm2() -> None:
    """The shipped adapter against the model it adapts, on dev-split sentences it never saw."""
    from edgestream.asr.text import load_splits
    from edgestream.llm.shared import load_adapter

    held_out = list(load_splits().dev[::40])
    lm = load_language_model("smollm2", pack=False)
    plain = nats_per_token(lm, held_out)
    load_adapter(DEFAULT_ADAPTER, lm)
    adapted = nats_per_token(lm, held_out)
    assert adapted < plain - 0.5, (plain, adapted)
