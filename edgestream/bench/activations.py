"""Pre-normalizers on real activations, and SmolLM2 decoded end to end in float16.

1. `norm_inputs`: the inputs of every LayerNorm of our Conformer (on speech) and every RMSNorm
   of SmolLM2 (on prompts), captured with forward pre-hooks and grouped by role, go through
   `numerics.activation_report`: does a norm computed in float16 overflow on them, and does
   the pre-normalizer fix it? Llama-family models carry a few massive activations in their
   residual stream, which is where a float16 sum of squares is at risk.
2. `float16_decoding`: SmolLM2 in float16 with every RMSNorm computed in float16 arithmetic
   (emulated exactly, float16 accumulator, as an accelerator without a wider accumulator
   would) without and with the pre-normalizer, next to the usual upcast-to-float32 RMSNorm,
   each compared token for token with float32 greedy decoding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch import Tensor, nn

from edgestream.asr.audio import read_audio
from edgestream.asr.features import compute_fbank
from edgestream.asr.model_io import AsrModel
from edgestream.llm.engine import generate_ar
from edgestream.llm.loading import LanguageModel, load_hf
from edgestream.llm.model import RMSNorm, Transformer
from edgestream.numerics import activation_report, rms_norm

NORM_VARIANTS = ("float32-upcast", "float16", "float16-prenormalized")


def _capture(
    model: nn.Module, kinds: tuple[type, ...], role: Callable[[str], str], run: Callable[[], None]
) -> dict[str, Tensor]:
    """Inputs of every module of `kinds` while `run()` runs, as (rows, d) per role."""
    captured: dict[str, list[Tensor]] = defaultdict(list)
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, kinds):

            def keep(_: nn.Module, args: tuple[Tensor, ...], name: str = name) -> None:
                x = args[0].detach()
                captured[role(name)].append(x.reshape(-1, x.shape[-1]).float())

            hooks.append(module.register_forward_pre_hook(keep))
    try:
        with torch.inference_mode():
            run()
    finally:
        for hook in hooks:
            hook.remove()
    return {name: torch.cat(rows) for name, rows in captured.items()}


def conformer_norm_inputs(asr: AsrModel, audio: list[str]) -> dict[str, Tensor]:
    """LayerNorm inputs of the Conformer over `audio` files, by role (e.g. "conformer/conv")."""

    def run() -> None:
        for path in audio:
            features = torch.from_numpy(asr.cmvn.normalize(compute_fbank(read_audio(path))))[None]
            asr.model(features, torch.tensor([features.shape[1]]))

    def role(name: str) -> str:  # "blocks.3.conv.depthwise_norm" -> "conformer/conv.depthwise_norm"
        parts = name.split(".")
        return "conformer/" + ".".join(parts[2:] if parts[0] == "blocks" else parts)

    return _capture(asr.model, (nn.LayerNorm,), role, run)


def llm_norm_inputs(lm: LanguageModel, prompts: list[str]) -> dict[str, Tensor]:
    """RMSNorm inputs of the language model over `prompts` (prefill), by role."""

    def run() -> None:
        for prompt in prompts:
            ids = lm.encode_prompt(prompt)
            lm.model(torch.tensor([ids]), lm.model.new_cache(len(ids)))

    def role(name: str) -> str:  # "layers.12.ffn_norm" -> "smollm2/ffn_norm"
        return f"{lm.name}/{name.split('.')[-1]}"

    return _capture(lm.model, (RMSNorm,), role, run)


def largest_magnitudes(tensors: dict[str, Tensor]) -> dict[str, float]:
    return {name: float(t.abs().max()) for name, t in tensors.items()}


class EmulatedRMSNorm(nn.Module):
    """RMSNorm computed in the input's float format (exact emulation, no wider accumulator)."""

    def __init__(self, norm: RMSNorm, prenormalizer: str) -> None:
        super().__init__()
        self.weight, self.eps, self.prenormalizer = norm.weight, norm.eps, prenormalizer

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight.to(x.dtype), self.eps, self.prenormalizer)


def _float16_model(name: str, variant: str) -> Transformer:
    hf_model, _ = load_hf(name)
    model = Transformer.from_hf(hf_model, torch.float16)
    if variant != "float32-upcast":
        kind = "optimal" if variant == "float16-prenormalized" else "none"
        for parent in model.modules():
            for child_name, child in parent.named_children():
                if isinstance(child, RMSNorm):
                    setattr(parent, child_name, EmulatedRMSNorm(child, kind))
    return model.eval()


def _agreeing_prefix(got: list[int], expected: list[int]) -> float:
    """Share of the reference's tokens produced before the first difference."""
    agreeing = 0
    for a, b in zip(got, expected, strict=False):
        if a != b:
            break
        agreeing += 1
    return agreeing / len(expected)


def float16_decoding(
    lm: LanguageModel, prompts: list[str], max_new_tokens: int = 32
) -> dict[str, dict[str, object]]:
    """Per variant: prompts whose float16 greedy tokens equal float32's, the mean share of
    tokens before the first difference, and how many outputs had non-finite logits."""
    stop = lm.stop_ids
    prompt_ids = [lm.encode_prompt(p) for p in prompts]
    reference = [generate_ar(lm.model, ids, max_new_tokens, stop).token_ids for ids in prompt_ids]
    results: dict[str, dict[str, object]] = {}
    for variant in NORM_VARIANTS:
        model = _float16_model(lm.name, variant)
        identical, agreement, nonfinite = 0, [], 0
        for ids, expected in zip(prompt_ids, reference, strict=True):
            got = generate_ar(model, ids, max_new_tokens, stop).token_ids
            with torch.inference_mode():
                logits = model(torch.tensor([ids]), model.new_cache(len(ids)), last_only=True)
            nonfinite += int(not torch.isfinite(logits).all())
            identical += got == expected
            agreement.append(_agreeing_prefix(got, expected))
        results[variant] = {
            "identical_outputs": identical,
            "prompts": len(prompts),
            "mean_agreeing_prefix": round(sum(agreement) / len(agreement), 3),
            "nonfinite_prefill_logits": nonfinite,
        }
    return results


def activations_study(
    asr: AsrModel,
    lm: LanguageModel,
    audio: list[str],
    prompts: list[str],
    max_new_tokens: int = 32,
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float8_e4m3fn),
    kinds: tuple[str, ...] = ("none", "optimal"),
) -> dict[str, object]:
    """Both parts, JSON-ready: {"report" (activation_report records), "largest" (max |x| per
    role), "float16_decoding" (per norm variant)}."""
    conformer = conformer_norm_inputs(asr, audio)
    llm = llm_norm_inputs(lm, prompts)
    records = []
    for tensors, op in ((conformer, "layer_norm"), (llm, "rms_norm")):
        report = activation_report(tensors, dtypes, kinds, (op,))
        records.extend(report["results"])
    return {
        "eps": None,
        "accumulate_dtype": None,
        "results": records,
        "largest": {k: round(v, 2) for k, v in largest_magnitudes(conformer | llm).items()},
        "float16_decoding": float16_decoding(lm, prompts, max_new_tokens),
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
    }
