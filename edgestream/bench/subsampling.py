"""The subsampling front end's share of the encoder's compute and latency: depthwise separable
against vanilla Conv2d subsampling, in the same Conformer, on streaming chunks.

FLOPs are counted by `torch.utils.flop_counter` (convolutions and matrix products: what a
mobile accelerator spends its time on); latency is the median wall time per streaming chunk
on one thread, with the subsampling timed separately in the same run. The paper reports the
share of compute falling from 32.8% to 4.0%.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from edgestream.asr.conformer import (
    SUBSAMPLING_CONTEXT,
    SUBSAMPLING_FACTOR,
    ConformerConfig,
    ConformerCTC,
)


def _flops(module: torch.nn.Module, *args: object) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(*args)
    return counter.get_total_flops()


def _median_ms(function: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times)


def _measure(
    config: ConformerConfig, chunk_frames: int, left_chunks: int, repeats: int
) -> dict[str, float]:
    torch.manual_seed(0)
    model = ConformerCTC(config).eval()
    window = torch.randn(1, SUBSAMPLING_FACTOR * (chunk_frames - 1) + SUBSAMPLING_CONTEXT, 80)
    max_cached = left_chunks * chunk_frames
    caches = model.empty_cache()
    with torch.no_grad():  # fill the attention cache as a long stream would have it
        for step in range(left_chunks):
            _, caches = model.forward_chunk(
                model.subsampling(window), step * chunk_frames, caches, max_cached
            )
        x = model.subsampling(window)

    def front() -> None:
        with torch.no_grad():
            model.subsampling(window)

    def encoder(x: torch.Tensor) -> None:
        model.forward_chunk(x, max_cached, caches, max_cached)

    def whole() -> None:
        with torch.no_grad():
            encoder(model.subsampling(window))

    for _ in range(3):  # warm-up
        whole()
    sub_flops, encoder_flops = _flops(model.subsampling, window), _flops(encoder, x)
    sub_ms, total_ms = _median_ms(front, repeats), _median_ms(whole, repeats)
    return {
        "subsampling_parameters": sum(p.numel() for p in model.subsampling.parameters()),
        "model_parameters": model.num_parameters(),
        "subsampling_mflops": sub_flops / 1e6,
        "chunk_mflops": (sub_flops + encoder_flops) / 1e6,
        "flops_share": sub_flops / (sub_flops + encoder_flops),
        "subsampling_ms": sub_ms,
        "chunk_ms": total_ms,
        "latency_share": sub_ms / total_ms,
    }


def subsampling_share(
    config: ConformerConfig, chunk_frames: int = 16, left_chunks: int = 4, repeats: int = 30
) -> dict[str, dict[str, float]]:
    """For each subsampling kind: parameters, FLOPs and ms per chunk, of the subsampling and
    of the whole chunk step (with a full left-context cache), and the subsampling's shares."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            kind: _measure(replace(config, subsampling=kind), chunk_frames, left_chunks, repeats)
            for kind in ("conv2d", "dwsep")
        }
    finally:
        torch.set_num_threads(previous)
