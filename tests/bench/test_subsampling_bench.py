from __future__ import annotations

from dataclasses import replace

from edgestream.bench.subsampling import subsampling_share
from tests.asr.conftest import TINY


def test_depthwise_separable_subsampling_takes_a_smaller_share_of_compute() -> None:
    config = replace(TINY, d_model=64, subsampling_channels=64)
    results = subsampling_share(config, chunk_frames=8, left_chunks=2, repeats=3)
    assert set(results) == {"conv2d", "dwsep"}
    dwsep, vanilla = results["dwsep"], results["conv2d"]
    assert 0 < dwsep["flops_share"] < vanilla["flops_share"] < 1
    assert dwsep["subsampling_mflops"] * 2 < vanilla["subsampling_mflops"]
    assert all(0 < row["latency_share"] < 1 and row["chunk_ms"] > 0 for row in results.values())
