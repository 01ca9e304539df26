"""Norms on real activations: capture by role, emulated float16 RMSNorm, float16 decoding."""

from __future__ import annotations

from pathlib import Path

import torch

from edgestream.asr.model_io import load_model
from edgestream.bench.activations import (
    NORM_VARIANTS,
    EmulatedRMSNorm,
    conformer_norm_inputs,
    float16_decoding,
    llm_norm_inputs,
)
from edgestream.llm.loading import load_language_model
from edgestream.llm.model import RMSNorm
from tests.asr.conftest import random_model  # noqa: F401 (fixture)
from tests.conftest import needs_smollm2

SAMPLE = Path(__file__).parents[2] / "edgestream/asr/samples/why-is-the-sky-blue.wav"


def test_norm_inputs_are_captured_by_role(
    tiny_model_dir: Path,
    random_model: Path,  # noqa: F811
) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    captured = llm_norm_inputs(lm, ["the quick brown fox", "paris is the capital"])
    name = str(tiny_model_dir)
    assert set(captured) == {f"{name}/attention_norm", f"{name}/ffn_norm", f"{name}/norm"}
    assert all(t.shape[1] == 64 and len(t) > 0 for t in captured.values())
    conformer = conformer_norm_inputs(load_model(random_model), [str(SAMPLE)])
    assert {"conformer/conv.depthwise_norm", "conformer/attention.norm"} <= set(conformer)


def test_a_massive_activation_overflows_a_float16_rms_norm_unless_prenormalized() -> None:
    norm = RMSNorm(576, 1e-5)
    x = torch.randn(4, 576)
    x[:, 7] = 24_926.0  # the size SmolLM2 carries into its norms (measured)
    expected = norm(x)
    naive = EmulatedRMSNorm(norm, "none")(x.half())
    fixed = EmulatedRMSNorm(norm, "optimal")(x.half())
    assert not torch.isfinite(naive).all() or naive.abs().max() == 0  # sum of squares > 65504
    assert torch.isfinite(fixed).all()
    assert torch.allclose(fixed.float(), expected, rtol=1e-2, atol=1e-2)


def test_float16_decoding_reports_every_variant(tiny_model_dir: Path) -> None:
    lm = load_language_model(str(tiny_model_dir), pack=False)
    result = float16_decoding(lm, ["the quick brown fox", "select count"], max_new_tokens=6)
    assert list(result) == list(NORM_VARIANTS)
    for row in result.values():
        assert row["prompts"] == 2 and 0 <= row["identical_outputs"] <= 2
        assert 0 <= row["mean_agreeing_prefix"] <= 1


@needs_smollm2
def test_smollm2_needs_the_prenormalizer_to_decode_in_float16() -> None:
    lm = load_language_model("smollm2", pack=False)
    result = float16_decoding(lm, ["What is the capital of France?"], max_new_tokens=8)
    assert result["float16"]["nonfinite_prefill_logits"] == 1  # the naive norm overflows
    assert result["float16"]["identical_outputs"] == 0
    assert result["float16-prenormalized"]["nonfinite_prefill_logits"] == 0
    assert result["float16-prenormalized"]["identical_outputs"] == 1
