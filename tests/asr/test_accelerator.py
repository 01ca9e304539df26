"""The accelerator-shaped Conformer equals the original, and its pre-normalized LayerNorm keeps
float16 finite where the plain one overflows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from edgestream.asr.accelerator import AcceleratorConformer, ChannelLayerNorm
from edgestream.asr.conformer import ConformerCTC
from edgestream.asr.features import load_audio
from edgestream.asr.manifest import read_manifest
from edgestream.asr.model_io import load_model
from edgestream.asr.streaming import Recognizer, StreamingOptions

from .conftest import TINY


def _stream(model: nn.Module, x: torch.Tensor, chunk: int, left: int) -> torch.Tensor:
    caches, pieces = model.empty_cache(), []
    with torch.no_grad():
        for start in range(0, x.shape[1], chunk):
            out, caches = model.forward_chunk(
                x[:, start : start + chunk], start, caches, left * chunk
            )
            pieces.append(out)
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("prenormalize", [False, True])
@pytest.mark.parametrize(("chunk", "left"), [(1, 2), (8, 4), (16, 0)])
@pytest.mark.parametrize("ff_slice", [256, 48])
def test_same_log_probs_as_the_original(
    prenormalize: bool, chunk: int, left: int, ff_slice: int
) -> None:
    torch.manual_seed(0)
    model = ConformerCTC(dataclasses.replace(TINY, num_layers=3)).eval()
    accelerated = AcceleratorConformer(model, prenormalize, ff_slice)
    # TINY's feed-forwards are 128 wide: one slice, or 48 + 48 + 32.
    assert len(accelerated.blocks[0].ff_first.ups) == (1 if ff_slice == 256 else 3)
    x = model.subsampling(3 * torch.randn(1, 4 * 45 + 3, 80)).detach()
    torch.testing.assert_close(
        _stream(accelerated, x, chunk, left), _stream(model, x, chunk, left), atol=1e-4, rtol=0
    )


def test_caches_stay_channels_first_and_bounded() -> None:
    model = AcceleratorConformer(ConformerCTC(TINY).eval())
    caches = model.empty_cache()
    d = TINY.d_model
    assert caches[0].keys.shape == (1, d, 1, 0) and caches[0].conv.shape[:3] == (1, d, 1)
    x = torch.randn(1, 8, d)
    with torch.no_grad():
        for start in (0, 8, 16):
            _, caches = model.forward_chunk(x, start, caches, 12)
    assert caches[0].keys.shape == caches[0].values.shape == (1, d, 1, 12)


def test_all_linear_layers_became_1x1_convolutions() -> None:
    accelerated = AcceleratorConformer(ConformerCTC(TINY).eval())
    encoder = [m for name, m in accelerated.named_modules() if not name.startswith("subsampling")]
    assert not any(isinstance(m, nn.Linear) for m in encoder)
    assert sum(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in encoder) > 10


def test_same_transcripts_through_the_recognizer(random_model: Path, tiny_corpus: Path) -> None:
    asr = load_model(random_model)
    accelerated = dataclasses.replace(asr, model=AcceleratorConformer(asr.model))
    for entry in read_manifest(tiny_corpus / "dev.jsonl"):
        samples = load_audio(tiny_corpus / entry.audio)
        texts = []
        for candidate in (asr, accelerated):
            recognizer = Recognizer(candidate, StreamingOptions(chunk_ms=320, left_chunks=2))
            recognizer.accept_waveform(samples)
            texts.append(recognizer.finalize())
        assert texts[0] == texts[1] and texts[0]


def test_prenormalizer_keeps_float16_layer_norm_right() -> None:
    torch.manual_seed(1)
    norm = nn.LayerNorm(256)
    x = 400 * torch.randn(2, 256, 1, 8)  # squares ~ 1.6e5: beyond float16's 65504
    reference = norm(x.transpose(1, 3)).transpose(1, 3)
    plain = ChannelLayerNorm(norm, prenormalize=False).half()(x.half())
    safe = ChannelLayerNorm(norm, prenormalize=True).half()(x.half())
    # The sum of squares overflows to inf, so 1/sqrt(variance) is 0: silently all-zero output.
    assert (plain.float() - reference).abs().max() > 1.0
    assert torch.isfinite(safe).all()
    torch.testing.assert_close(safe.float(), reference, atol=2e-2, rtol=0)
    tiny = ChannelLayerNorm(norm, prenormalize=True).half()(1e-3 * x.half())  # eps dominates
    torch.testing.assert_close(
        tiny.float(), norm((1e-3 * x).transpose(1, 3)).transpose(1, 3), atol=2e-2, rtol=0
    )
