"""`eagle3-hf tune`: pick the fastest draft-tree shape (total_tokens, depth, top_k, lookup_tokens) on this machine.

Each shape decodes the same prompts with the tree, interleaved with plain `generate`, greedily or (`--temperature`)
by sampling with sampled trees, each prompt `--seeds` times; the shape with the highest speedup over those plain
runs wins. `lookup_tokens` is the number of prompt-lookup tokens grafted onto each
tree (`tree_lookup_tokens`, 0 for the pure EAGLE-3 tree). `--save` writes the winner into the head folder's
`generation_config.json`, where `generate` reads its defaults. `--offset` keeps the tuning prompts apart from the
first prompts that `eagle3-hf bench --limit N` measures.
"""

import argparse
import itertools
import json
from pathlib import Path

from ..atomic import write_text_atomically
from ..loading import DEFAULT_TARGET
from . import add_draft_dtype_argument, add_pack_weights_argument, check_at_least, check_draft_dtype
from .arguments import TARGET_HELP


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-hf tune", description=__doc__.split("\n")[0])
    parser.add_argument("--head", default=None, help="EAGLE-3 head folder or Hub id; default: the shipped head")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=TARGET_HELP)
    parser.add_argument("--total-tokens", nargs="+", type=int, default=[8, 16, 24, 32])
    parser.add_argument("--depth", nargs="+", type=int, default=[3, 4, 5, 6])
    parser.add_argument("--top-k", nargs="+", type=int, default=[2, 4, 6])
    parser.add_argument(
        "--lookup-tokens", nargs="+", type=int, default=[0, 4], help="prompt-lookup tokens grafted per tree (0: none)"
    )
    parser.add_argument("--datasets", nargs="+", default=["mt_bench"], choices=["mt_bench", "humaneval", "sharegpt"])
    parser.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    parser.add_argument("--offset", type=int, default=0, help="skip this many prompts of each dataset first")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampling (sampled trees)")
    parser.add_argument("--seeds", type=int, default=1, help="sampling seeds per prompt (temperature > 0)")
    add_pack_weights_argument(parser, "every swept shape's row counts")
    add_draft_dtype_argument(parser)
    parser.add_argument("--output", default="outputs/tune.json")
    parser.add_argument("--save", action="store_true", help="store the winner in the head's generation_config.json")
    return parser


SHAPE_KEYS = ("tree_total_tokens", "tree_depth", "tree_top_k", "tree_lookup_tokens")


def sweep(
    target,
    tokenizer,
    draft,
    prompts,
    shapes,
    max_new_tokens: int,
    temperature: float = 0.0,
    seeds: int = 1,
    progress: bool = True,
    draft_dtype: str = "auto",
) -> list[dict]:
    """Measure tokens/s and tau of every `(total_tokens, depth, top_k, lookup_tokens)` shape (a 3-tuple means no
    lookup tokens); plain `generate` as reference. At `temperature > 0` every prompt is sampled `seeds` times (with
    sampled trees, as `generate` does by default). `draft_dtype` is `generate`'s `tree_draft_dtype`. Returns one
    dict per shape (`SHAPE_KEYS`, `draft_dtype` (the dtype the head drafted in), `tokens_per_second`, `speedup`,
    `tau`, `generations`), fastest first."""
    from tqdm.auto import tqdm

    from ..bench.measure import run_benchmark, summarize
    from ..generation.decoding import TreeSettings
    from .bench import drafting_dtype

    results = []
    for shape in tqdm(shapes, desc="tree shapes", disable=not progress):
        shape_kwargs = dict(zip(SHAPE_KEYS, (*shape, 0)[:4]))
        tree_kwargs = {**shape_kwargs, **_draft_dtype_kwargs(draft_dtype)}
        # "auto" is decided once per head and frontier width (top_k): the dtype every run of this shape drafted in
        drafted_in = drafting_dtype(target, draft, TreeSettings(*shape[:3]), draft_dtype)
        method = "tree_lookup" if shape_kwargs["tree_lookup_tokens"] else "tree"
        records = []
        for seed in range(seeds):  # sampled answers differ by seed; every seed samples plain and the tree alike
            records += run_benchmark(
                target,
                tokenizer,
                draft,
                prompts,
                methods=["plain", method],
                temperatures=[temperature],
                max_new_tokens=max_new_tokens,
                tree_kwargs=tree_kwargs,
                seed=seed * len(prompts),
                warmup=0,
                progress=False,
            )
        dataset_rows = [r for r in summarize(records)["rows"] if "/" not in r["dataset"]]  # no per-category rows
        rows = [r for r in dataset_rows if r["method"] == method]
        tokens = sum(r["new_tokens"] for r in rows)
        seconds = sum(r["seconds"] for r in rows)
        plain = [r for r in dataset_rows if r["method"] == "plain"]
        plain_speed = sum(r["new_tokens"] for r in plain) / sum(r["seconds"] for r in plain)
        results.append(
            {
                **shape_kwargs,
                "draft_dtype": drafted_in,
                "tokens_per_second": tokens / seconds,
                "speedup": tokens / seconds / plain_speed,
                "tau": _pooled_tau(rows),
                "generations": sum(r["generations"] for r in rows),
            }
        )
    # Rank by speedup over the plain runs interleaved with the same shape: robust to load drifting between shapes.
    return sorted(results, key=lambda r: -r["speedup"])


def _draft_dtype_kwargs(draft_dtype: str) -> dict:
    """`generate`'s `tree_draft_dtype` for a `--draft-dtype` value (none for "auto", generate's default)."""
    return {} if draft_dtype == "auto" else {"tree_draft_dtype": draft_dtype}


def measure_adaptive(
    target,
    tokenizer,
    draft,
    prompts,
    shape: dict,
    max_new_tokens: int,
    temperature: float,
    draft_dtype: str = "auto",
) -> dict:
    """Speedup and tau of `generate`'s adaptive planner starting from `shape` (a `sweep` row), against plain
    `generate` interleaved on the same prompts; the head drafts in `draft_dtype` (`generate`'s `tree_draft_dtype`)."""
    from ..bench.measure import run_benchmark, summarize

    start = {key: shape[key] for key in SHAPE_KEYS}
    records = run_benchmark(
        target,
        tokenizer,
        draft,
        prompts,
        methods=["plain", "adaptive"],
        temperatures=[temperature],
        max_new_tokens=max_new_tokens,
        tree_kwargs={**start, **_draft_dtype_kwargs(draft_dtype)},
        warmup=1,
        progress=False,
    )
    rows = [r for r in summarize(records)["rows"] if "/" not in r["dataset"]]
    speed = {
        method: sum(r["new_tokens"] for r in rows if r["method"] == method)
        / sum(r["seconds"] for r in rows if r["method"] == method)
        for method in ("plain", "adaptive")
    }
    adaptive_rows = [r for r in rows if r["method"] == "adaptive"]
    return {**start, "speedup": speed["adaptive"] / speed["plain"], "tau": _pooled_tau(adaptive_rows)}


def _pooled_tau(rows: list[dict]) -> float | None:
    """Tokens per round over all rows (None when no round ran, e.g. every answer ended at its first token)."""
    rounds = sum(r["rounds"] for r in rows)
    return sum(r["tau"] * r["rounds"] for r in rows if r["rounds"]) / rounds if rounds else None


def valid_shapes(total_tokens: list[int], depths: list[int], top_ks: list[int]) -> list[tuple[int, int, int]]:
    """Shapes where the tree can be filled and reach its depth: `depth + 1 <= total_tokens <= max_nodes`, both
    counting the root (`TreeSettings.max_nodes = 1 + top_k + (depth - 1) * top_k**2`; a tree of fewer than
    `depth + 1` nodes is a shallower shape). Raises `ValueError`, naming the grid, when no shape is left."""
    from ..generation.decoding import TreeSettings

    shapes = [
        (n, d, k)
        for n, d, k in itertools.product(total_tokens, depths, top_ks)
        if d + 1 <= n <= TreeSettings(n, d, k).max_nodes
    ]
    if not shapes:
        raise ValueError(
            f"No valid tree shape in --total-tokens {total_tokens} --depth {depths} --top-k {top_ks}: each shape "
            "needs depth + 1 <= total_tokens <= 1 + top_k + (depth - 1) * top_k**2 (nodes, root included)."
        )
    return shapes


def save_tree_settings(head_dir: Path, settings: dict) -> None:
    """Store the `SHAPE_KEYS` of `settings` in `head_dir/generation_config.json`, keeping what else it holds."""
    from transformers import GenerationConfig

    path = head_dir / "generation_config.json"
    config = GenerationConfig.from_pretrained(head_dir) if path.is_file() else GenerationConfig()
    for key in SHAPE_KEYS:  # setattr: GenerationConfig.update ignores keys it does not already have
        setattr(config, key, settings[key])
    config.save_pretrained(head_dir)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    check_draft_dtype(parser, "--draft-dtype", args.draft_dtype)
    check_at_least(
        parser,
        {
            "--total-tokens": (args.total_tokens, 2),
            "--depth": (args.depth, 1),
            "--top-k": (args.top_k, 1),
            "--limit": (args.limit, 1),
            "--offset": (args.offset, 0),
            "--max-new-tokens": (args.max_new_tokens, 1),
            "--seeds": (args.seeds, 1),
            "--temperature": (args.temperature, 0.0),
        },
    )
    from ..bench.prompts import load_prompts
    from ..generation.cpu_packing import pack_for_decoding, rows_for_trees
    from ..loading import DEFAULT_HEAD_DIR, load_default_pair

    if min(args.lookup_tokens) < 0:
        raise SystemExit(f"--lookup-tokens must be non-negative, got {args.lookup_tokens}.")
    head_dir = Path(args.head or DEFAULT_HEAD_DIR)
    if args.save and not head_dir.is_dir():  # before the sweep, not after minutes of it
        raise SystemExit(f"--save needs a local head folder; --head {head_dir} is not one.")
    try:
        shapes = valid_shapes(args.total_tokens, args.depth, args.top_k)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    prompts = load_prompts(args.datasets, args.limit, num_turns=1, offset=args.offset)
    if not prompts:
        raise SystemExit(f"--offset {args.offset} skips every prompt of {args.datasets}.")
    shapes = [(*shape, lookup_tokens) for shape in shapes for lookup_tokens in args.lookup_tokens]
    target, tokenizer, draft = load_default_pair(args.head, target=args.target)
    print(pack_for_decoding(target, draft, *rows_for_trees(shapes), args.pack_weights))
    results = sweep(
        target,
        tokenizer,
        draft,
        prompts,
        shapes,
        args.max_new_tokens,
        args.temperature,
        args.seeds,
        draft_dtype=args.draft_dtype,
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    # the sweep is kept before the adaptive run (minutes more); its null entry says that run has not finished
    write_text_atomically(args.output, json.dumps({"shapes": results, "adaptive_from_fastest": None}, indent=1))
    for row in results[:10]:
        print(json.dumps(row))
    best = results[0]
    print(
        f"fastest: total_tokens={best['tree_total_tokens']} depth={best['tree_depth']} top_k={best['tree_top_k']}"
        f" lookup_tokens={best['tree_lookup_tokens']} (the head drafting in {best['draft_dtype']})"
        f" -> {best['tokens_per_second']:.1f} tokens/s, {best['speedup']:.2f}x, tau {best['tau']}"
    )
    # What users get: generate's own planner, starting from the winner and picking each round's shape from there.
    adaptive = measure_adaptive(
        target, tokenizer, draft, prompts, best, args.max_new_tokens, args.temperature, args.draft_dtype
    )
    print(f"adaptive default starting there (what generate does with it): {adaptive['speedup']:.2f}x")
    write_text_atomically(args.output, json.dumps({"shapes": results, "adaptive_from_fastest": adaptive}, indent=1))
    if args.save:
        save_tree_settings(head_dir, best)
        print(f"saved to {head_dir / 'generation_config.json'} (generate's starting shape at every temperature)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
