from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edgestream.asr.conformer import (
    ConformerConfig,
    ConformerCTC,
    Subsampling,
    chunk_mask,
    subsampled_length,
)

from .conftest import TINY


@given(st.integers(0, 200))
def test_subsampled_length_matches_the_convolutions(frames: int) -> None:
    expected = Subsampling(TINY)(torch.zeros(1, frames, 80)).shape[1] if frames >= 7 else 0
    assert subsampled_length(frames) == expected == int(subsampled_length(torch.tensor(frames)))


@given(st.integers(1, 40), st.integers(1, 8), st.integers(-1, 4))
def test_chunk_mask_sees_own_chunk_and_left_chunks_only(frames: int, chunk: int, left: int) -> None:
    mask = chunk_mask(frames, chunk, left)
    for i in range(frames):
        for j in range(frames):
            allowed = j // chunk <= i // chunk and (left < 0 or j // chunk >= i // chunk - left)
            assert bool(mask[i, j]) == allowed


def test_depthwise_separable_subsampling_is_much_cheaper() -> None:
    dwsep = Subsampling(ConformerConfig(subsampling="dwsep")).convs
    vanilla = Subsampling(ConformerConfig(subsampling="conv2d")).convs
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(dwsep) * 5 < count(vanilla)


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="subsampling"):
        ConformerConfig(subsampling="vgg")
    with pytest.raises(ValueError, match="num_heads"):
        ConformerConfig(d_model=30, num_heads=4)


@pytest.mark.parametrize(("chunk", "left"), [(1, 0), (4, 2), (6, -1), (16, 4)])
def test_chunked_steps_with_caches_equal_the_offline_chunk_masked_pass(
    chunk: int, left: int
) -> None:
    torch.manual_seed(0)
    model = ConformerCTC(TINY).eval()
    features = torch.randn(1, 4 * 53 + 3, 80)
    with torch.no_grad():
        offline, lengths = model(features, torch.tensor([features.shape[1]]), chunk, left)
        x = model.subsampling(features)
        caches, pieces = model.empty_cache(), []
        for start in range(0, x.shape[1], chunk):
            max_cached = left * chunk if left >= 0 else -1
            out, caches = model.forward_chunk(
                x[:, start : start + chunk], start, caches, max_cached
            )
            pieces.append(out)
            if left >= 0:
                assert caches[0].keys.shape[2] <= left * chunk
    streamed = torch.cat(pieces, dim=1)
    assert streamed.shape == offline.shape and int(lengths) == offline.shape[1]
    torch.testing.assert_close(streamed, offline, atol=1e-5, rtol=1e-5)


def test_outputs_never_depend_on_later_chunks() -> None:
    torch.manual_seed(1)
    model = ConformerCTC(TINY).eval()
    features = torch.randn(1, 4 * 40 + 3, 80)
    changed = features.clone()
    # Encoder frame i reads fbank frames 4i..4i+6: frame 23's last is 98, frame 24 reads 99.
    changed[:, 99:] = torch.randn_like(changed[:, 99:])
    lengths = torch.tensor([features.shape[1]])
    with torch.no_grad():
        a, _ = model(features, lengths, 8, 2)
        b, _ = model(changed, lengths, 8, 2)
    torch.testing.assert_close(a[:, :23], b[:, :23])  # chunks 0-2 end at frame 23
    assert not torch.allclose(a[:, 24:], b[:, 24:])


def test_padding_does_not_change_an_utterance() -> None:
    torch.manual_seed(2)
    model = ConformerCTC(TINY).eval()
    short = torch.randn(1, 120, 80)
    padded = torch.cat([short, torch.randn(1, 80, 80)], dim=1)
    batch = torch.cat([padded, torch.randn(1, 200, 80)])
    with torch.no_grad():
        alone, n = model(short, torch.tensor([120]), 4, -1)
        together, lengths = model(batch, torch.tensor([120, 200]), 4, -1)
    torch.testing.assert_close(together[0, : int(n)], alone[0], atol=1e-5, rtol=1e-5)
    assert lengths.tolist() == [subsampled_length(120), subsampled_length(200)]
