"""`eagle3-hf magpie`: the target writes user prompts itself (Magpie), filtered, into a resumable JSONL file."""

import argparse
import logging

from ..loading import DEFAULT_TARGET
from . import check_at_least
from .arguments import TARGET_HELP, add_batched_generation_arguments, load_target_for_batches


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-hf magpie",
        description="Sample user prompts from the target given only its chat template's user prefix (Magpie), keep "
        "those that pass the filters (length, not cut off, no duplicates or near-duplicates, no overlap with the "
        "benchmark's evaluation sets) and write them as chat records, one per line; answer them with `eagle3-hf "
        "regenerate --data FILE`. Rerunning with the same --output (and the same settings) resumes.",
    )
    parser.add_argument("--output", required=True, help="JSONL file to write (appended to when resuming).")
    parser.add_argument("--num-prompts", type=int, required=True, help="Prompts the file should hold.")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=TARGET_HELP)
    parser.add_argument("--batch-size", type=int, default=32, help="Prompts sampled per generate call.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature.")
    parser.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling (1: off).")
    parser.add_argument("--top-k", type=int, default=0, help="Top-k sampling (0: off).")
    parser.add_argument("--min-tokens", type=int, default=3, help="Shortest prompt kept, in tokens.")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        help="Longest prompt kept, in tokens; a prompt that has not ended by then is cut off and dropped.",
    )
    parser.add_argument(
        "--near-duplicate-threshold",
        type=float,
        default=0.7,
        help="Drop a prompt whose word-trigram Jaccard similarity with a kept one reaches this (above 1: exact "
        "duplicates only).",
    )
    parser.add_argument(
        "--system-prompt",
        default=None,
        help="System message before the user turn (default: none; the template's own default, if any, is used).",
    )
    parser.add_argument(
        "--prompt-starts",
        nargs="+",
        default=None,
        metavar="WORDS",
        help="Opening words of the prompts, one per candidate in turn (e.g. 'Write a story' Explain): steers the kind "
        "of request; the model writes the rest (default: none, plain Magpie).",
    )
    parser.add_argument(
        "--no-evaluation-filter",
        action="store_true",
        help="Keep prompts that overlap MT-bench, HumanEval or the held-out ShareGPT prompts.",
    )
    parser.add_argument(
        "--max-batches",
        type=int,
        default=None,
        help="Stop after this many batches in all (default: 10 x num-prompts / batch-size).",
    )
    add_batched_generation_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    check_at_least(  # before the target loads
        parser,
        {
            "--num-prompts": (args.num_prompts, 1),
            "--batch-size": (args.batch_size, 1),
            "--min-tokens": (args.min_tokens, 1),
            "--max-tokens": (args.max_tokens, args.min_tokens),
            "--max-batches": (args.max_batches, 1),
            "--temperature": (args.temperature, 0.0),
            "--top-k": (args.top_k, 0),
            "--near-duplicate-threshold": (args.near_duplicate_threshold, 0.0),
        },
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from eagle3_hf.training.exclusion import EvaluationIndex
    from eagle3_hf.training.magpie import magpie_prompts

    # Before loading the target: a missing evaluation package fails at once, with its install command.
    evaluation_index = EvaluationIndex([]) if args.no_evaluation_filter else EvaluationIndex.from_benchmarks()
    model, tokenizer, cache_implementation = load_target_for_batches(
        args, logging.getLogger("eagle3_hf.training.magpie")
    )
    threshold = args.near_duplicate_threshold if args.near_duplicate_threshold <= 1 else None
    stats = magpie_prompts(
        model,
        tokenizer,
        args.output,
        args.num_prompts,
        batch_size=args.batch_size,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        system_prompt=args.system_prompt,
        prompt_starts=args.prompt_starts,
        near_duplicate_threshold=threshold,
        evaluation_index=evaluation_index,
        seed=args.seed,
        max_batches=args.max_batches,
        cache_implementation=cache_implementation,
        progress=not args.no_progress,
    )
    rejected = ", ".join(f"{reason} {count}" for reason, count in stats.rejected.items())
    print(
        f"wrote {stats.written} prompts to {args.output} ({stats.skipped_done} already there); "
        f"{stats.candidates} sampled in {stats.batches} batches, rejected: {rejected}; {stats.new_tokens} tokens in "
        f"{stats.seconds:.1f} s ({stats.tokens_per_second:.1f} tokens/s). Answer them with: eagle3-hf regenerate "
        f"--data {args.output} --output ANSWERS.jsonl"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
