"""`eagle3-hf bench`: tau, tokens/s and speedup of plain generate, prompt lookup, chain mode and the EAGLE-3 tree.

Example (the README's results):
    eagle3-hf bench --datasets mt_bench humaneval sharegpt --temperatures 0 1 --limit 10 --max-new-tokens 128
"""

import argparse
import platform
import shlex
import sys

from ..bench.measure import METHODS, PROMPT_LOOKUP_NUM_TOKENS, TREE_LOOKUP_TOKENS
from ..loading import DEFAULT_TARGET
from . import (
    add_draft_dtype_argument,
    add_pack_weights_argument,
    check_at_least,
    check_draft_dtype,
    drafting_head_for,
)
from .arguments import TARGET_DTYPES, TARGET_HELP


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-hf bench", description=__doc__.split("\n")[0])
    parser.add_argument("--head", default=None, help="EAGLE-3 head (folder or Hub id); default: the shipped head")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=TARGET_HELP)
    parser.add_argument(
        "--target-dtype",
        default="auto",
        choices=TARGET_DTYPES,
        help="dtype of the target and the head (default: the checkpoint's; the offline SmolLM2 file loads in "
        "float32). Greedy output is compared with plain generate in every dtype, but only float32 promises it "
        "bit-identical: in bfloat16 or float16 a tree's multi-row verification may break a near-tie of the next "
        "token's logits the other way (scripts/measure_low_precision_ties.py shows where).",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["mt_bench", "humaneval", "sharegpt"],
        choices=["mt_bench", "humaneval", "sharegpt"],
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--limit", type=int, default=None, help="prompts per dataset (default: all)")
    parser.add_argument("--offset", type=int, default=0, help="skip this many prompts of each dataset first")
    parser.add_argument("--turns", type=int, default=2, help="MT-bench turns per question (1 or 2)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--tree-total-tokens", type=int, default=None)
    parser.add_argument("--tree-depth", type=int, default=None)
    parser.add_argument("--tree-top-k", type=int, default=None)
    parser.add_argument(
        "--tree-lookup-tokens",
        type=int,
        default=None,
        help="prompt-lookup tokens grafted onto each tree by the tree_lookup method (default: the head's "
        f"generation_config.tree_lookup_tokens, else {TREE_LOOKUP_TOKENS})",
    )
    add_draft_dtype_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_pack_weights_argument(parser, "the row counts each method verifies")
    parser.add_argument("--output-dir", default="outputs/bench")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def tree_kwargs_from_args(args) -> dict:
    """The tree arguments given on the command line; with `--pack-weights off`, also `tree_pack_weights=False`
    (else `generate` would pack for the trees itself, and every method measured after it would use those kernels)."""
    names = {
        "tree_total_tokens": args.tree_total_tokens,
        "tree_depth": args.tree_depth,
        "tree_top_k": args.tree_top_k,
        "tree_lookup_tokens": args.tree_lookup_tokens,
        "tree_pack_weights": False if args.pack_weights == "off" else None,
        "tree_draft_dtype": None if args.draft_dtype == "auto" else args.draft_dtype,
    }
    return {name: value for name, value in names.items() if value is not None}


def pack_for_methods(target, draft, args, tree) -> str:
    """Pack the weights for the rows every benchmarked method verifies, so that no method is measured with a
    slower kernel than another: the tree's nodes, the head's frontier and accepted paths, chain mode's chain + 1
    and every prompt-lookup length (2 to `prompt_lookup_num_tokens + 1`). `tree`: `bench_tree_settings`."""
    from ..generation.candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS
    from ..generation.cpu_packing import pack_for_decoding, rows_for_tree

    target_rows, draft_rows = rows_for_tree(tree.total_tokens, tree.depth, tree.top_k)
    if "chain" in args.methods:
        target_rows.append(DEFAULT_NUM_ASSISTANT_TOKENS + 1)
    if "prompt_lookup" in args.methods:
        target_rows.extend(range(2, PROMPT_LOOKUP_NUM_TOKENS + 2))
    if "tree_lookup" in args.methods:  # same tree size; the head re-encodes accepted paths up to the chain's length
        draft_rows.extend(range(2, tree.lookup_tokens + 2))
    if "adaptive" in args.methods:  # trees up to two levels deeper; plain steps' tokens re-encoded in one batch
        draft_rows.extend(range(2, max(tree.depth + 2, 4) + 2))
    return pack_for_decoding(target, draft, target_rows, draft_rows, args.pack_weights)


def drafting_dtype(target, draft, tree, requested: str) -> str:
    """The dtype `generate` drafts in with `tree_draft_dtype=requested` (for `"auto"` decided here, once, as the
    first generate call would, and kept for every later call), for the report."""
    head = drafting_head_for(target, draft, requested, rows=tree.top_k)
    return str(head.fc.weight.dtype).removeprefix("torch.")


def bench_tree_settings(draft, args):
    """The run's tree settings, `lookup_tokens` the `tree_lookup` method's: resolved once, for the packed rows,
    every generate call and `summarize` (which ends each method's acceptance by position at its deepest draft)."""
    from ..bench.measure import resolve_tree_lookup_tokens
    from ..generation.decoding import resolve_tree_settings

    lookup = resolve_tree_lookup_tokens(draft, args.tree_lookup_tokens)
    return resolve_tree_settings(draft, args.tree_total_tokens, args.tree_depth, args.tree_top_k, lookup)


def bench_command(argv: list[str] | None) -> str:
    """The command line recorded in the report: `argv` from `eagle3-hf bench`, else (`python -m
    eagle3_hf.commands.bench`) the process's arguments after the script."""
    return "eagle3-hf bench " + shlex.join(sys.argv[1:] if argv is None else argv)


def machine_description() -> str:
    import os

    import torch

    from eagle3_hf.cpu_features import cpu_model, describe_cpu_features

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    else:
        features = describe_cpu_features()
        device = f"{cpu_model()} ({features}), {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"{platform.machine()} {device}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.tree_lookup_tokens is not None and args.tree_lookup_tokens < 1:
        parser.error(
            f"--tree-lookup-tokens {args.tree_lookup_tokens}: expected >= 1 (the tree method is the tree alone)"
        )
    check_draft_dtype(parser, "--draft-dtype", args.draft_dtype)
    check_at_least(
        parser,
        {
            "--limit": (args.limit, 1),
            "--offset": (args.offset, 0),
            "--turns": (args.turns, 1),
            "--max-new-tokens": (args.max_new_tokens, 1),
            "--threads": (args.threads, 1),
            "--temperatures": (args.temperatures, 0.0),
        },
    )
    if args.turns > 2:
        parser.error(f"--turns {args.turns}: expected 1 or 2 (MT-bench questions have two turns).")
    import torch

    from ..bench.measure import run_benchmark, summarize
    from ..bench.prompts import load_prompts
    from ..bench.report import markdown_table, write_report
    from ..loading import load_default_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, draft = load_default_pair(args.head, dtype=args.target_dtype, target=args.target)
    tree = bench_tree_settings(draft, args)
    if "tree_lookup" in args.methods:  # every generate call grafts what the packed rows and the summary assume
        args.tree_lookup_tokens = tree.lookup_tokens
    packing = pack_for_methods(target, draft, args, tree)
    packing += f", the head drafting in {drafting_dtype(target, draft, tree, args.draft_dtype)}"
    print(f"target and head: {packing}")
    prompts = load_prompts(args.datasets, args.limit, num_turns=args.turns, offset=args.offset)
    records = run_benchmark(
        target,
        tokenizer,
        draft,
        prompts,
        methods=args.methods,
        temperatures=args.temperatures,
        max_new_tokens=args.max_new_tokens,
        tree_kwargs=tree_kwargs_from_args(args),
        seed=args.seed,
        progress=not args.no_progress,
    )
    summary = summarize(records, args.max_new_tokens, tree)
    command = bench_command(argv)
    machine = f"{machine_description()}, target in {str(target.dtype).removeprefix('torch.')}, {packing}"
    paths = write_report(summary, args.output_dir, machine, command, plots=not args.no_plots)
    print(markdown_table(summary))
    print("wrote " + ", ".join(str(p) for p in paths))
    return report_greedy_mismatches(summary, target.dtype)


def report_greedy_mismatches(summary: dict, dtype) -> int:
    """The exit status: 1 when a greedy output computed in float32 or wider differed from plain `generate` (a bug:
    decoding there is bit-identical), 0 otherwise. In lower precision a difference is reported, not failed: a tree
    verifies several rows in one forward, whose kernels round differently from plain decoding's one row, and a bfloat16
    or float16 near-tie of the two best logits can then go the other way."""
    import torch

    mismatches = sum(row["greedy_mismatches"] or 0 for row in summary["rows"] if "/" not in row["dataset"])
    if not mismatches:
        return 0
    if torch.finfo(dtype).bits >= 32:
        print(f"ERROR: {mismatches} greedy outputs differ from plain generate", file=sys.stderr)
        return 1
    print(
        f"WARNING: {mismatches} greedy outputs differ from plain generate with the target in "
        f"{str(dtype).removeprefix('torch.')}; expected "
        "where plain's two best logits are within a rounding step (scripts/measure_low_precision_ties.py reports "
        "the margin where they part); float32 output is bit-identical.",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
