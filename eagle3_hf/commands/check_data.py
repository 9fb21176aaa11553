"""`eagle3-hf check-data`: which training records overlap the benchmark's evaluation prompts (exit 1 if any)."""

import argparse
import logging
from dataclasses import fields

from ..training.exclusion import EVALUATION_SETS, MIN_WORDS, NGRAM
from . import check_at_least, is_data_source
from .arguments import DataArguments


_DATA_HELP = next(option.metadata["help"] for option in fields(DataArguments) if option.name == "data")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-hf check-data",
        description="Check that training data leaves out the benchmark's evaluation prompts: a record overlaps one "
        "when a user turn equals it after normalisation (case, punctuation and whitespace ignored) or shares a run "
        "of --ngram words with it. Prints the count per evaluation set and the prompts hit most; exits with 1 when "
        "any record overlaps, 0 otherwise.",
    )
    parser.add_argument("data", help=_DATA_HELP)
    parser.add_argument("--data-offset", type=int, default=0, help="First record to check.")
    parser.add_argument("--data-limit", type=int, default=None, help="Number of records to check (default: all).")
    parser.add_argument(
        "--eval-sets",
        nargs="+",
        default=list(EVALUATION_SETS),
        choices=list(EVALUATION_SETS),
        help="Evaluation sets to check against (sharegpt: the benchmark's held-out ShareGPT prompts).",
    )
    parser.add_argument("--ngram", type=int, default=NGRAM, help="Length of the shared word runs that count.")
    parser.add_argument(
        "--min-words",
        type=int,
        default=MIN_WORDS,
        help="Prompts shorter than --ngram but with at least this many words count when contained whole; shorter "
        "ones only when equal.",
    )
    parser.add_argument("--show", type=int, default=5, help="Print this many offending records and prompts.")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not is_data_source(args.data):
        parser.error(f"data: {args.data} is not a file (a ShareGPT/chat JSON or JSONL file, or 'sharegpt').")
    if args.ngram < 1 or not 1 <= args.min_words <= args.ngram:
        parser.error(f"--ngram {args.ngram} --min-words {args.min_words}: expected 1 <= --min-words <= --ngram.")
    check_at_least(parser, {"--data-offset": (args.data_offset, 0), "--data-limit": (args.data_limit, 1)})
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from eagle3_hf.training.exclusion import EvaluationIndex, check_evaluation_overlap

    index = EvaluationIndex.from_benchmarks(args.eval_sets, n=args.ngram, min_words=args.min_words)
    try:
        report = check_evaluation_overlap(args.data, index, offset=args.data_offset, limit=args.data_limit)
    except ValueError as error:  # a record that is not JSON, bytes that are not UTF-8: named with file and line
        raise SystemExit(f"eagle3-hf check-data: {error}") from None
    # A check of nothing must not pass as a clean one.
    if report.checked == 0:
        raise SystemExit(f"eagle3-hf check-data: {args.data} has no records from --data-offset {args.data_offset}.")
    if report.invalid == report.checked:
        raise SystemExit(
            f"eagle3-hf check-data: none of the {report.checked} records of {args.data} is a chat record "
            "('conversations' in ShareGPT form or 'messages' in chat form), so nothing was checked."
        )
    offending = report.offending
    print(
        f"{args.data}: {report.checked} records checked ({report.invalid} invalid), {len(offending)} overlap the "
        "evaluation sets"
    )
    for dataset, indices in report.overlaps.items():
        print(f"  {dataset}: {len(indices)} records")
    if not offending:
        return 0
    print("records (source index: evaluation prompts):")
    for record_index in offending[: args.show]:
        found = "; ".join(f"{dataset} {', '.join(ids)}" for dataset, ids in report.examples[record_index].items())
        print(f"  {record_index}: {found}")
    print("evaluation prompts hit most (records, prompt):")
    for dataset, prompt_id, count in report.by_prompt()[: args.show]:
        print(f"  {count:>6}  {dataset} {prompt_id}: {index.prompts[dataset, prompt_id]!r:.100}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
