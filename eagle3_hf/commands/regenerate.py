"""`eagle3-hf regenerate`: answer the user turns of chat data with the target itself (resumable JSONL)."""

import argparse
import logging
from dataclasses import fields

from ..loading import DEFAULT_TARGET
from . import check_at_least, is_data_source
from .arguments import TARGET_HELP, DataArguments, add_batched_generation_arguments, load_target_for_batches


# The data options mean what they mean for `train` and `vocab`: the same names, defaults and help.
_DATA_HELP = {option.name: option.metadata["help"] for option in fields(DataArguments)}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-hf regenerate",
        description="Regenerate the assistant turns of chat data with the target model. Output is JSONL, one "
        "conversation per line; rerunning with the same --output (and the same --target and --data) resumes after the "
        "conversations already written.",
    )
    parser.add_argument("--output", required=True, help="JSONL file to write (appended to when resuming).")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=TARGET_HELP)
    parser.add_argument("--data", default=DataArguments.data, help=_DATA_HELP["data"])
    parser.add_argument("--data-offset", type=int, default=DataArguments.data_offset, help=_DATA_HELP["data_offset"])
    parser.add_argument("--data-limit", type=int, default=DataArguments.data_limit, help=_DATA_HELP["data_limit"])
    parser.add_argument("--batch-size", type=int, default=8, help="Conversations per generate call.")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="Longest answer per turn.")
    parser.add_argument(
        "--max-length",
        type=int,
        default=2048,
        help="Longest conversation in tokens, as train counts them (use train's --max_length): each answer is cut "
        "to fit, and a conversation ends when no room is left.",
    )
    parser.add_argument(
        "--max-turns", type=int, default=None, help="Answer only the first N user turns of each conversation."
    )
    parser.add_argument(
        "--min-turns",
        type=int,
        default=1,
        help="Skip the records with fewer user turns than N (2: only conversations with later turns to learn from).",
    )
    parser.add_argument("--do-sample", action="store_true", help="Sample instead of greedy decoding.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (with --do-sample).")
    parser.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling (with --do-sample).")
    parser.add_argument(
        "--top-k",
        type=int,
        default=0,
        help="Top-k sampling (with --do-sample; 0, the default: off, as at T=1 in bench).",
    )
    add_batched_generation_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not is_data_source(args.data):
        parser.error(f"--data {args.data}: not a file (a ShareGPT/chat JSON or JSONL file, or 'sharegpt').")
    check_at_least(  # before the target loads
        parser,
        {
            "--data-offset": (args.data_offset, 0),
            "--data-limit": (args.data_limit, 1),
            "--batch-size": (args.batch_size, 1),
            "--max-new-tokens": (args.max_new_tokens, 1),
            "--max-length": (args.max_length, 1),
            "--max-turns": (args.max_turns, 1),
            "--min-turns": (args.min_turns, 1),
            "--temperature": (args.temperature, 0.0),
            "--top-k": (args.top_k, 0),
        },
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from eagle3_hf.training.regenerate import make_generation_config, regenerate

    model, tokenizer, cache_implementation = load_target_for_batches(
        args, logging.getLogger("eagle3_hf.training.regenerate")
    )
    generation_config = make_generation_config(
        model,
        tokenizer,
        args.max_new_tokens,
        args.do_sample,
        args.temperature,
        args.top_p,
        args.top_k,
        cache_implementation=cache_implementation,
    )
    stats = regenerate(
        model,
        tokenizer,
        args.data,
        args.output,
        generation_config=generation_config,
        offset=args.data_offset,
        limit=args.data_limit,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_turns=args.max_turns,
        min_turns=args.min_turns,
        seed=args.seed,
        progress=not args.no_progress,
    )
    print(
        f"wrote {stats.written} conversations to {args.output} ({stats.skipped_done} already there, "
        f"{stats.skipped_empty} without a user turn, {stats.skipped_short} with fewer than {args.min_turns}, "
        f"{stats.invalid} invalid); {stats.turns} turns, "
        f"{stats.new_tokens} tokens in {stats.seconds:.1f} s ({stats.tokens_per_second:.1f} tokens/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
