"""The speculative-decoding benchmark's bookkeeping on a tiny model (not its timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from edgestream.bench.spec import (
    LLAMACPP_INSTALL,
    bench_spec,
    hf_prompt_lookup_decoder,
    llamacpp_available,
    llamacpp_decoder,
    read_spec_prompts,
)
from edgestream.cli import app
from edgestream.llm.loading import load_language_model, resolve_model
from edgestream.llm.methods import MethodOptions, make_decoder
from edgestream.llm.msa import SpeculativeStreams, StreamConfig, save_streams
from tests.conftest import needs_smollm2

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["the quick brown fox", "what is"]},
    {"question_id": 2, "category": "sql", "turns": ["select count(*) from users"]},
]
STATS = {
    "new_tokens",
    "seconds",
    "tokens_per_second",
    "speedup",
    "mean_accepted",
    "call_reduction",
    "exact_match_vs_ar",
}


@pytest.fixture()
def setup(tiny_model_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    lm = load_language_model(str(tiny_model_dir))
    torch.manual_seed(0)
    streams = SpeculativeStreams(lm.model.config, StreamConfig(3, 2, 4, draft_vocab_size=0))
    save_streams(streams, tmp_path / "streams.safetensors", {})
    return prompts, tmp_path / "streams.safetensors"


@pytest.mark.parametrize("draft_dtype", ["float32", "bfloat16", "int8"])
def test_ss_matches_ar_and_every_statistic_is_reported(
    tiny_model_dir: Path, setup: tuple[Path, Path], draft_dtype: str
) -> None:
    prompts, streams = setup
    lm = load_language_model(str(tiny_model_dir))
    options = MethodOptions(streams_path=streams, draft_dtype=draft_dtype)
    decoders = {m: make_decoder(m, lm, options) for m in ("ar", "ss")}
    report = bench_spec(lm, decoders, read_spec_prompts(prompts), 12, threads=1)
    ss = report["methods"]["ss"]
    assert ss["overall"].keys() == STATS
    assert set(ss["categories"]) == {"writing", "sql"}
    assert ss["overall"]["exact_match_vs_ar"] == 1.0 and report["divergent"] == []
    ar = report["methods"]["ar"]["overall"]
    assert ar["speedup"] == 1.0 and ar["mean_accepted"] == 1.0
    assert ss["overall"]["new_tokens"] == ar["new_tokens"]


def test_prompt_lookup_ours_and_transformers_match_ar(
    tiny_model_dir: Path, setup: tuple[Path, Path]
) -> None:
    prompts, _ = setup
    lm = load_language_model(str(tiny_model_dir))
    decoders = {
        "ar": make_decoder("ar", lm),
        "pld": make_decoder("pld", lm, MethodOptions(pld_tokens=4)),
        "hf-pld": hf_prompt_lookup_decoder(lm, 4),
    }
    report = bench_spec(lm, decoders, read_spec_prompts(prompts), 24, threads=1)
    for name in ("pld", "hf-pld"):
        overall = report["methods"][name]["overall"]
        assert overall["exact_match_vs_ar"] == 1.0, report["divergent"]
        assert overall["mean_accepted"] >= 1.0


def test_cli_writes_the_json_it_promises(
    tiny_model_dir: Path, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    prompts, streams = setup
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "spec",
            "--prompts",
            str(prompts),
            "--model",
            str(tiny_model_dir),
            "--streams",
            str(streams),
            "--max-new-tokens",
            "8",
            "--threads",
            "1",
            "--draft-dtype",
            "bfloat16",
            "--tree-nodes",
            "6",
            "--tree-top-k",
            "3,2",
            "--tree-min-prob",
            "0.05",
            "--no-context-drafts",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["setup"]["options"]["draft_dtype"] == "bfloat16"
    tree = {"top_k": [3, 2], "max_nodes": 6, "min_path_prob": 0.05}
    assert report["setup"]["options"]["tree"] == tree
    assert report["setup"]["options"]["context_drafts"] is False
    assert {"model", "max_new_tokens", "methods"} <= report.keys()
    assert set(report["methods"]) == {"ar", "ss"}
    assert report["methods"]["ss"]["extra_parameters"] > 0
    assert report["methods"]["ar"]["extra_parameters"] == 0
    assert report["setup"]["peak_memory_mib"] > 0
    for method in ("ar", "ss"):  # each measured alone, in a `generate` process of its own
        alone = report["methods"][method]["peak_memory_mib"]
        assert 0 < alone <= report["setup"]["peak_memory_mib"] * 1.5


def test_an_unknown_suite_is_named_in_a_one_line_error(tiny_model_dir: Path) -> None:
    argv = ["bench", "spec", "--suite", "everything", "--model", str(tiny_model_dir)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "unknown suite 'everything'" in result.output
    assert "chat-probe" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "expected a JSON object"),
        ('{"question_id": 1, "category": "x", "turns": []}', "non-empty list"),
    ],
)
def test_bad_question_files_are_refused(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        read_spec_prompts(path)


@pytest.mark.skipif(llamacpp_available(), reason="llama-cpp-python is installed here")
def test_llamacpp_is_skipped_with_a_note_when_not_installed(
    tiny_model_dir: Path, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    prompts, _ = setup
    out = tmp_path / "spec.json"
    args = ["bench", "spec", "--prompts", str(prompts), "--model", str(tiny_model_dir)]
    args += ["--methods", "ar,pld,llamacpp", "--max-new-tokens", "4", "--json", str(out)]
    args += ["--no-memory"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "llamacpp skipped" in result.stderr and "make llamacpp" in result.stderr
    assert set(json.loads(out.read_text())["methods"]) == {"ar", "pld"}


@needs_smollm2
@pytest.mark.skipif(
    not llamacpp_available(), reason=f"llama-cpp-python missing: {LLAMACPP_INSTALL}"
)
def test_llamacpp_decodes_smollm2s_gguf_greedily() -> None:
    lm = load_language_model("smollm2")
    decode = llamacpp_decoder(lm, resolve_model("smollm2"), threads=2)
    ids = lm.encode_prompt("Name three primary colours.")
    result = decode(ids, 24, None)
    assert 0 < result.new_tokens <= 24 and result.mean_accepted == 1.0
    assert decode(ids, 24, None).token_ids == result.token_ids  # greedy: deterministic
    # Q4_1 weights, yet the answer starts as our float32 engine's does.
    ours = make_decoder("ar", lm)(ids, 24, None).token_ids
    assert result.token_ids[:3] == ours[:3]


def test_sampled_bench_keeps_every_method_identical_to_ar(
    tiny_model_dir: Path, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    prompts, streams = setup
    out = tmp_path / "spec.json"
    args = ["bench", "spec", "--prompts", str(prompts), "--model", str(tiny_model_dir)]
    args += ["--streams", str(streams), "--methods", "ar,ss,pld", "--temperature", "0.8"]
    args += ["--seed", "5", "--max-new-tokens", "10", "--threads", "1", "--json", str(out)]
    args += ["--no-memory"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["setup"]["decoding"].startswith("sampled: temperature 0.8")
    for method in ("ss", "pld"):
        assert report["methods"][method]["overall"]["exact_match_vs_ar"] == 1.0
    refused = CliRunner().invoke(app, [*args[:6], "--methods", "ar,hf-pld", "--temperature", "1"])
    assert refused.exit_code == 2 and "greedy only" in refused.stderr


def test_a_divergence_is_located_and_its_logit_gap_measured(
    tiny_model_dir: Path, setup: tuple[Path, Path]
) -> None:
    from edgestream.llm.engine import GenerationResult

    prompts, _ = setup
    lm = load_language_model(str(tiny_model_dir))
    ar = make_decoder("ar", lm)

    def second_best_at_3(ids: list[int], max_new_tokens: int, on_token: object) -> object:
        """ar's output with its fourth token replaced by the base model's runner-up there."""
        result = ar(ids, max_new_tokens, on_token)
        if len(result.token_ids) < 4:
            return result
        context = torch.tensor([ids + result.token_ids[:3]])
        logits = lm.model(context, lm.model.new_cache(context.shape[1]), last_only=True)[0, -1]
        tokens = [*result.token_ids[:3], int(logits.topk(2).indices[1])]
        return GenerationResult(tokens, result.forward_passes, result.seconds, "length")

    decoders = {"ar": ar, "odd": second_best_at_3}
    report = bench_spec(lm, decoders, read_spec_prompts(prompts), 12, threads=1)
    assert report["methods"]["odd"]["overall"]["exact_match_vs_ar"] == 0.0
    first = report["divergent"][0]
    assert (first["method"], first["turn"], first["position"]) == ("odd", 0, 3)
    assert first["method_token"] != first["ar_token"]
    assert first["logit_gap"] > 0  # ar's token is the argmax: the runner-up trails it
    summary = report["divergence_summary"]["odd"]
    assert summary["prompts"] == 2 and summary["max_abs_logit_gap"] >= first["logit_gap"]
