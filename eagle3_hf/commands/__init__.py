"""One module per `eagle3-hf` subcommand, each exposing `make_parser()` and `main(argv)`."""

from pathlib import Path


PACK_WEIGHTS_MODES = (
    "auto",
    "on",
    "off",
)  # `eagle3_hf.generation.cpu_packing.PACK_MODES`, without importing torch here


def add_pack_weights_argument(parser, rows: str) -> None:
    """The `--pack-weights auto|on|off` option shared by our commands; `rows` says which row counts one packs."""
    parser.add_argument(
        "--pack-weights",
        default="auto",
        choices=list(PACK_WEIGHTS_MODES),
        help=f"pack the linear weights (MKL or oneDNN, the faster here) for {rows}, and switch sdpa models to "
        "grouped-query SDPA (auto: on CPU with float32, for the row counts where packing measurably pays on this "
        "machine; plain decoding's one-row steps are unaffected)",
    )


def add_draft_dtype_argument(parser) -> None:
    """The `--draft-dtype` option of `bench` and `tune`: `generate`'s `tree_draft_dtype` (check it with
    `check_draft_dtype` once parsed)."""
    parser.add_argument(
        "--draft-dtype",
        default="auto",
        help="dtype the head drafts in (generate's tree_draft_dtype): 'auto' (a bfloat16 copy on CPU where timed "
        "faster), 'float32', 'bfloat16', ...",
    )


def draft_dtype_problem(option: str, value: str) -> str | None:
    """What is wrong with `value` as a dtype the head can draft in (`generate`'s `tree_draft_dtype`: 'auto' or a
    floating dtype name), naming `option`; None when it is fine. Checked before any model is loaded."""
    from ..generation.draft_precision import resolve_draft_dtype

    try:
        resolve_draft_dtype(value)
    except ValueError:
        return f"{option}={value}: expected 'auto' or a floating dtype name (float32, bfloat16)."
    return None


def check_draft_dtype(parser, option: str, value: str) -> None:
    """Exit through `parser.error` when `draft_dtype_problem` finds `value` wrong."""
    problem = draft_dtype_problem(option, value)
    if problem:
        parser.error(problem)


def below_minimum(minimums: dict) -> str | None:
    """The message for the first option below its minimum (None when none is).

    `minimums`: `{"--limit": (args.limit, 1), ...}`; a value of None (the option not given) passes, and a list (an
    `nargs="+"` option) is checked element by element.
    """
    for option, (value, minimum) in minimums.items():
        values = value if isinstance(value, list) else [value]
        below = [item for item in values if item is not None and item < minimum]
        if below:
            return f"{option} {below[0]}: expected >= {minimum}."
    return None


def check_at_least(parser, minimums: dict) -> None:
    """Exit through `parser.error` when `below_minimum` finds an option too small, before anything slow runs."""
    problem = below_minimum(minimums)
    if problem:
        parser.error(problem)


def is_data_source(data: str, names: tuple[str, ...] = ("sharegpt",)) -> bool:
    """Whether `--data` names something the commands read: an existing file or one of `names` (`"sharegpt"`, the
    shipped file; `diagnose`'s held-out side also takes the benchmarks' prompts)."""
    return data in names or Path(data).is_file()


def drafting_head_for(target, draft, requested: str, rows: int):
    """The head as `generate(..., tree_draft_dtype=requested)` drafts with it (`draft_precision.drafting_head` on
    the head prepared for `target`): the head itself, or its copy in another dtype (for `"auto"` timed here over
    `rows` nodes, once, as the first generate call would, and kept for every later call)."""
    from ..generation.decoding import prepare_draft
    from ..generation.draft_precision import drafting_head

    return drafting_head(prepare_draft(draft, target), requested, rows=rows)
