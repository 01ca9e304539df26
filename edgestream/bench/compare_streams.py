"""Two or more sets of stream weights in one benchmark run, every arm interleaved per prompt.

Comparing stream files in separate `bench spec` runs compares machine loads as much as weights
(AR itself has run at 21 to 48 tok/s on the same kind of machine). Here every file gets an
`ss` and an `ss-pld` arm next to `ar` and `pld`, all in one process, so load falls on all of
them alike:

    python -m edgestream.bench.compare_streams OLD.safetensors NEW.safetensors \\
        --suite-limit 3 --chat-probe 8 --json docs/bench-spec-streams-run4.json

Arms are named `ss@LABEL` and `ss-pld@LABEL`, LABEL being each file's stem (or `--labels`);
`--trees 8:4,3,2,1 12:8,6,4,2` gives every file a set of arms per draft tree (nodes: candidates
per depth), named `ss@LABEL/12:8,6,4,2`; `--methods ss` leaves out the `ss-pld` arms;
`--context-drafts both` gives every arm a twin that drafts only from the streams' vocabulary
(`/vocab`) next to the default that also drafts context tokens (`/context`);
`--draft-dtypes float32,int8` gives every arm one twin per drafting precision (`/int8`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from edgestream.bench.spec import BenchPrompt, bench_spec, chat_probe, read_spec_prompts, task_suite
from edgestream.llm.loading import DTYPES, LanguageModel, load_language_model
from edgestream.llm.methods import DRAFT_DTYPES, Decoder, MethodOptions, make_decoder
from edgestream.llm.tree import TreeShape, parse_counts

STREAM_METHODS = ("ss", "ss-pld")
CONTEXT_DRAFTS = {"on": (True,), "off": (False,), "both": (True, False)}


def stream_arms(
    lm: LanguageModel,
    files: dict[str, Path],
    trees: tuple[TreeShape, ...] = (),
    methods: tuple[str, ...] = STREAM_METHODS,
    context_drafts: tuple[bool, ...] = (True,),
    draft_dtypes: tuple[str, ...] = ("auto",),
) -> dict[str, Decoder]:
    """`ar` and `pld`, then `ss@label` and `ss-pld@label` for every labelled stream file; with
    several `trees`, one set per tree, named `ss@label/NODES:K1,K2,...`; with both
    `context_drafts` settings, one set each, named `.../context` and `.../vocab`; with several
    `draft_dtypes`, one set each, named `.../DTYPE`."""
    decoders = {"ar": make_decoder("ar", lm), "pld": make_decoder("pld", lm)}
    for label, path in files.items():
        for tree in trees or (TreeShape(),):
            tree_suffix = f"/{tree_name(tree)}" if len(trees) > 1 else ""
            for context in context_drafts:
                context_suffix = ("/context" if context else "/vocab") * (len(context_drafts) > 1)
                for dtype in draft_dtypes:
                    options = MethodOptions(
                        streams_path=path, tree=tree, context_drafts=context, draft_dtype=dtype
                    )
                    suffix = tree_suffix + context_suffix + f"/{dtype}" * (len(draft_dtypes) > 1)
                    for method in methods:
                        decoders[f"{method}@{label}{suffix}"] = make_decoder(method, lm, options)
    return decoders


def tree_name(tree: TreeShape) -> str:
    return f"{tree.max_nodes}:{','.join(map(str, tree.top_k))}"


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
        "--trees",
        nargs="+",
        default=[],
        help="draft trees as NODES:K1,K2,... (e.g. 8:4,3,2,1 12:8,6,4,2), an arm set each "
        "(default: the decoder's own)",
    )
    parser.add_argument(
        "--methods", default=",".join(STREAM_METHODS), help="stream arms: ss, ss-pld or both"
    )
    parser.add_argument(
        "--context-drafts",
        default="on",
        choices=tuple(CONTEXT_DRAFTS),
        help="draft context tokens outside the streams' vocabulary: on (the decoder's "
        "default), off, or both (an arm set each)",
    )
    parser.add_argument(
        "--draft-dtypes",
        default="auto",
        help=f"comma-separated drafting precisions, an arm set each (of {', '.join(DRAFT_DTYPES)})",
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


def _trees(specs: list[str]) -> tuple[TreeShape, ...]:
    trees = []
    for spec in specs:
        nodes, colon, top_k = spec.partition(":")
        if not colon:
            raise ValueError(f"--trees expects NODES:K1,K2,... like 8:4,3,2,1, got {spec!r}")
        (max_nodes,) = parse_counts(nodes, f"--trees {spec!r}: NODES")
        trees.append(TreeShape(parse_counts(top_k, f"--trees {spec!r}: K1,K2,..."), max_nodes))
    if len({tree_name(t) for t in trees}) != len(trees):
        raise ValueError(f"--trees names a tree twice: {specs}")
    return tuple(trees)


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(text.split(","))
    if not methods or not set(methods) <= set(STREAM_METHODS) or len(set(methods)) != len(methods):
        raise ValueError(f"--methods expects some of {', '.join(STREAM_METHODS)}, got {text!r}")
    return methods


def _draft_dtypes(text: str) -> tuple[str, ...]:
    dtypes = tuple(text.split(","))
    if not set(dtypes) <= set(DRAFT_DTYPES) or len(set(dtypes)) != len(dtypes):
        raise ValueError(f"--draft-dtypes expects some of {', '.join(DRAFT_DTYPES)}, got {text!r}")
    return dtypes


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        files = _labelled(args.streams, args.labels)
        trees, methods = _trees(args.trees), _methods(args.methods)
        draft_dtypes = _draft_dtypes(args.draft_dtypes)
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
        decoders = stream_arms(
            lm, files, trees, methods, CONTEXT_DRAFTS[args.context_drafts], draft_dtypes
        )
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
