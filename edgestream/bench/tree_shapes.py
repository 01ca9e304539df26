"""Draft tree shapes ranked by simulated acceptance on held-out distilled answers.

    python -m edgestream.bench.tree_shapes runs/streams-run5/distill-at-20 STREAMS.safetensors \\
        --nodes 4,8,12,16 --top-k 4,3,2,1 8,6,4,2

For every tree (nodes x candidates per depth) it prints the tokens per verification pass that
Speculative Streaming would reach on the answers a training run held out (`--held-out` must be
that run's `--dev-sequences`, so the streams never saw them), from one batched pass of the
streams (`llm.tree_search`). It ranks acceptance, not speed: time the close ones with
`python -m edgestream.bench.compare_streams --trees`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

from edgestream.llm.distill import load_shards
from edgestream.llm.loading import DTYPES, load_language_model
from edgestream.llm.msa import load_streams
from edgestream.llm.train import StreamObjective, advance_states, hold_out
from edgestream.llm.tree import TreeShape, parse_counts
from edgestream.llm.tree_search import held_out_drafts, simulate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("distilled", type=Path, help="a training run's distill-at-N folder")
    parser.add_argument("streams", type=Path, help="stream weights")
    parser.add_argument("--held-out", type=int, default=64, help="the run's --dev-sequences")
    parser.add_argument("--nodes", default="4,6,8,12,16", help="comma-separated tree sizes")
    parser.add_argument(
        "--top-k", nargs="+", default=["4,3,2,1", "8,6,4,2"], help="candidates per depth"
    )
    parser.add_argument(
        "--context-drafts",
        default="on",
        choices=("on", "off"),
        help="draft context tokens outside the streams' vocabulary, as the decoder does (on)",
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the table here")
    return parser


def _distilled(folder: Path) -> tuple[int, list[Path]]:
    """The layer a distill-at-N folder's states were captured at, and its shards."""
    match = re.fullmatch(r"distill-at-(\d+)", folder.name)
    shards = sorted(folder.glob("shard-*.pt")) if folder.is_dir() else []
    if match is None or not shards:
        raise ValueError(
            f"{folder} is not a distill-at-N folder of shards (e.g. runs/streams-lossless/"
            "distill-at-20, written by `edgestream train streams`)"
        )
    return int(match.group(1)), shards


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        captured_at, shards = _distilled(args.distilled)
        nodes = parse_counts(args.nodes, "--nodes")
        widths = [parse_counts(k, "--top-k") for k in args.top_k]
        if not args.streams.is_file():
            raise FileNotFoundError(f"stream weights not found: {args.streams}")
        torch.set_num_threads(args.threads)
        model = load_language_model(args.model, args.dtype, pack=False).model
        streams, _ = load_streams(args.streams, model)
        if captured_at > streams.split:
            raise ValueError(f"states captured at layer {captured_at}, above the streams'")
        _, held = hold_out(load_shards(shards), args.held_out)
        if not held:
            raise ValueError(f"no held-out sequences: --held-out {args.held_out}")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    held = advance_states(model, held, captured_at, streams.split)
    objective = StreamObjective(model.requires_grad_(False), streams, streams.split)
    context = args.context_drafts == "on"
    drafts = held_out_drafts(objective, held, max(max(k) for k in widths), context_drafts=context)
    rows = []
    for top_k in widths:
        for n in nodes:
            walk = simulate(drafts, TreeShape(top_k, n))
            rows.append({"nodes": n, "top_k": list(top_k), "tokens_per_pass": walk.tokens_per_pass})
            print(f"{n:3d} nodes  top-k {','.join(map(str, top_k)):10s} {walk.tokens_per_pass:.3f}")
    if args.json is not None:
        report = {"streams": str(args.streams), "held_out": len(held), "dtype": args.dtype}
        report["context_drafts"] = context
        args.json.write_text(json.dumps({**report, "trees": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
