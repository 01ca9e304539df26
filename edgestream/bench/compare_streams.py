"""Two or more sets of stream weights in one benchmark run, every arm interleaved per prompt.

Comparing stream files in separate `bench spec` runs compares machine loads as much as weights
(AR itself has run at 21 to 48 tok/s on the same kind of machine). Here every file gets an
`ss` and an `ss-pld` arm next to `ar` and `pld`, all in one process, so load falls on all of
them alike:

    python -m edgestream.bench.compare_streams OLD.safetensors NEW.safetensors \\
        --suite-limit 3 --chat-probe 8 --json docs/bench-spec-streams-run4.json

Arms are named `ss@LABEL` and `ss-pld@LABEL`, LABEL being each file's stem (or `--labels`);
`--tree-nodes 8,12` gives every file a pair of arms per draft tree size (`ss@LABEL/n12`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from edgestream.bench.spec import BenchPrompt, bench_spec, chat_probe, read_spec_prompts, task_suite
from edgestream.llm.loading import DTYPES, LanguageModel, load_language_model
from edgestream.llm.methods import Decoder, MethodOptions, make_decoder
from edgestream.llm.tree import TreeShape

STREAM_METHODS = ("ss", "ss-pld")


def stream_arms(
    lm: LanguageModel, files: dict[str, Path], tree_nodes: tuple[int, ...] = ()
) -> dict[str, Decoder]:
    """`ar` and `pld`, then `ss@label` and `ss-pld@label` for every labelled stream file; with
    several `tree_nodes`, one pair per tree size, named `ss@label/nN`."""
    decoders = {"ar": make_decoder("ar", lm), "pld": make_decoder("pld", lm)}
    sizes: tuple[int | None, ...] = tree_nodes or (None,)
    for label, path in files.items():
        for nodes in sizes:
            tree = TreeShape() if nodes is None else TreeShape(max_nodes=nodes)
            options = MethodOptions(streams_path=path, tree=tree)
            suffix = f"/n{nodes}" if len(sizes) > 1 else ""
            for method in STREAM_METHODS:
                decoders[f"{method}@{label}{suffix}"] = make_decoder(method, lm, options)
    return decoders


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="+", type=Path, help="stream weight files")
    parser.add_argument("--labels", help="comma-separated arm labels (default: file stems)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    parser.add_argument("--suite-limit", type=int, default=3, help="task-suite prompts per task")
    parser.add_argument(
        "--chat-probe", type=int, default=0, help="chat-probe prompts per kind (8: all 21)"
    )
    parser.add_argument(
        "--prompts", type=Path, help="a Spec-Bench question file, run after the suites"
    )
    parser.add_argument("--data", type=Path, help="shared data folder (the suites)")
    parser.add_argument(
        "--tree-nodes", help="comma-separated draft tree sizes, an arm pair each (default: 8)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the report here")
    return parser


def _labelled(files: list[Path], labels: str | None) -> dict[str, Path]:
    names = labels.split(",") if labels else [f.stem for f in files]
    if len(names) != len(files) or len(set(names)) != len(names):
        raise ValueError(f"expected {len(files)} distinct labels, got {names}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"stream weights not found: {', '.join(missing)}")
    return dict(zip(names, files, strict=True))


def _tree_sizes(text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        sizes = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ValueError(f"--tree-nodes expects integers like 8,12, got {text!r}") from None
    if min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"--tree-nodes expects distinct sizes >= 1, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        files = _labelled(args.streams, args.labels)
        tree_nodes = _tree_sizes(args.tree_nodes)
        if args.suite_limit < 0 or args.chat_probe < 0:
            raise ValueError("--suite-limit and --chat-probe must not be negative")
        prompts: list[BenchPrompt] = (
            task_suite(args.suite_limit, args.data) if args.suite_limit else []
        )
        if args.chat_probe:
            prompts += chat_probe(args.data, args.chat_probe)
        if args.prompts is not None:
            prompts += read_spec_prompts(args.prompts)
        if not prompts:
            raise ValueError("no prompts: give --suite-limit > 0, --chat-probe > 0 or --prompts")
        torch.set_num_threads(args.threads)
        lm = load_language_model(args.model, args.dtype)
        decoders = stream_arms(lm, files, tree_nodes)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    report = bench_spec(
        lm,
        decoders,
        prompts,
        args.max_new_tokens,
        args.threads,
        lambda done, total: print(f"\r{done}/{total} prompts", end="", file=sys.stderr),
    )
    print(file=sys.stderr)
    for name, method in report["methods"].items():
        overall = method["overall"]
        print(
            f"{name:24s} {overall['speedup']:.3f}x  {overall['mean_accepted']:.3f} tokens/pass  "
            f"exact {overall['exact_match_vs_ar']:.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
