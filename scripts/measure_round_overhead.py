"""Cost of one EAGLE-3 tree round against one plain decoding step, on SmolLM2-135M-Instruct.

A round is everything the tree loop does per verification: grow the draft tree, verify it with one target
forward, apply the logits processors, accept, compact the target cache and encode the accepted tokens into the
draft. A plain step is one iteration of stock greedy `generate`. The ratio round / step is the break-even
acceptance length: a trained head speeds decoding up only if its tau exceeds it.

The head is untrained (`Eagle3DraftModel.from_target`), so nearly every round accepts just the bonus token and
the loop runs about one round per new token; the cost of a round does not depend on the head's weights, but it
does depend on the head's vocabulary (its `lm_head` runs once per tree level): `--draft-vocab-size 8192` shows a
head with a reduced vocabulary, as trained heads usually have. `--head FOLDER` times a trained head instead (its
tau is then printed too, and a round's cost is what that head's rounds really cost: longer accepted paths cost
more to encode into the head), and `--mt-bench N` uses the first turns of N MT-bench questions as prompts instead of
the paragraph to summarise, which prompt lookup copies from. `--lookup-tokens N` adds prompt-lookup branches
(`tree_lookup_tokens`) to every tree, as the card's shape does.

`--variants LAYERSxMLP ...` (with `--head`) also times copies of the head grown to LAYERS decoder layers
(`grow_draft_head`, identity layers) and with MLPs MLP times as wide (`widen_draft_mlp`, zero channels). Those
copies compute what the head computes, so they draft the same trees and accept the same tokens (tau stays, up to
rounding in bfloat16 drafting), and the difference in a round's time is the exact extra cost of that capacity: the
share of tau a bigger head must add to pay for itself.

    .venv/bin/python scripts/measure_round_overhead.py                       # default grid, ~3 minutes on 2 cores
    .venv/bin/python scripts/measure_round_overhead.py --shapes 16x5x4 --repeats 5
    .venv/bin/python scripts/measure_round_overhead.py --pack-weights on        # MKL-packed weights (cpu_packing)
    .venv/bin/python scripts/measure_round_overhead.py --head model_cards/eagle3-SmolLM2-135M-Instruct --mt-bench 8 \
        --threads 2 --repeats 1 --new-tokens 64 --pack-weights auto --shapes 8x3x8,12x4x8   # the shipped head
    .venv/bin/python scripts/measure_round_overhead.py --head model_cards/eagle3-SmolLM2-135M-Instruct --mt-bench 40 \
        --threads 2 --repeats 1 --new-tokens 96 --pack-weights auto --shapes 12x4x8 --draft-dtypes float32 bfloat16
    .venv/bin/python scripts/measure_round_overhead.py --head model_cards/eagle3-SmolLM2-135M-Instruct --mt-bench 16 \
        --threads 2 --repeats 1 --new-tokens 96 --pack-weights auto --shapes 12x4x8 --lookup-tokens 6 \
        --variants 1x1 2x1 3x1 4x1 1x2 1x4                                                  # capacity at equal tau

Shapes are `total_tokens x depth x top_k`; `--draft-dtypes` runs each in every dtype listed (`generate`'s
`tree_draft_dtype`: `auto`, the default, or a dtype the head drafts in). Steps and rounds are timed with a streamer
(one `put` per plain step, one per tree round), so each includes all the per-step work of its loop. Runs are interleaved (plain, then every
shape, repeated); the fastest step and the fastest round are compared, because other processes on a small machine
only ever slow a step down (the median is printed too, to show how noisy the machine was). Tokens per second follow
the mean, which is printed beside them (`mean round / mean step` is what a head's tau must beat on a quiet machine).
"""

import argparse
import os
import statistics

import torch

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.bench.measure import StepClock, encode_chat
from eagle3_hf.bench.prompts import load_mt_bench
from eagle3_hf.commands import check_draft_dtype
from eagle3_hf.generation import original_generate
from eagle3_hf.generation.cpu_packing import is_packable_target, pack_for_decoding, pack_rows, rows_for_trees
from eagle3_hf.loading import load_default_pair, load_target
from eagle3_hf.training.heads import grow_draft_head, widen_draft_mlp


DEFAULT_SHAPES = [f"{total}x{depth}x{top_k}" for total in (8, 16, 24, 32) for depth, top_k in ((3, 4), (5, 4), (6, 6))]
PARAGRAPH = (
    "Speculative decoding lets a small draft model propose several tokens that the large target model then checks "
    "in a single forward pass. When the proposals are right, several tokens are produced for the price of one "
    "target step; when they are wrong, nothing is lost but the time spent drafting and verifying. "
)


def plain_step_seconds(target, input_ids, new_tokens: int) -> list[float]:
    """The time of every step of stock greedy generate."""
    clock = StepClock()
    original_generate(target, input_ids, do_sample=False, max_new_tokens=new_tokens, streamer=clock)
    return clock.intervals()


def tree_round_seconds(
    target,
    draft,
    input_ids,
    new_tokens: int,
    shape: tuple[int, int, int],
    draft_dtype: str = "auto",
    lookup_tokens: int = 0,
) -> tuple[dict, float]:
    """The time of every round, and of every part of a round, for one tree shape (pinned: no plain steps), and the
    generation's tau.

    The parts are what `Eagle3GenerateOutput.round_seconds` reports: `draft` (growing the tree), `verify` (the
    target's forward), `update` (encoding the accepted tokens into the draft) and `other` (acceptance, emitting and
    compacting the cache). The last `depth` rounds are left out: near `max_new_tokens` the tree is cut shorter, which
    makes them cheaper.
    """
    total, depth, top_k = shape
    clock = StepClock()
    output = target.generate(
        input_ids,
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=new_tokens,
        tree_total_tokens=total,
        tree_depth=depth,
        tree_top_k=top_k,
        tree_lookup_tokens=lookup_tokens,
        tree_pack_weights=False,  # packed (or not) by main, as --pack-weights says
        tree_draft_dtype=draft_dtype,
        streamer=clock,
        return_dict_in_generate=True,
    )
    parts = {"grow": "draft", "verify": "verify", "draft_update": "update", "other": "other"}
    timings = {part: list(output.round_seconds[name][: -depth or None]) for part, name in parts.items()}
    timings["round"] = clock.intervals(skip_last=depth)
    return timings, output.tau


def head_variant(draft: Eagle3DraftModel, layers: int, mlp_multiple: int) -> Eagle3DraftModel:
    """A copy of `draft` with `layers` decoder layers and MLPs `mlp_multiple` times as wide, computing what `draft`
    computes (identity layers, zero MLP channels)."""
    if layers < 1 or mlp_multiple < 1:
        raise SystemExit(f"--variants {layers}x{mlp_multiple}: layers and MLP multiple must be >= 1")
    wide = widen_draft_mlp(draft, draft.config.intermediate_size * mlp_multiple)
    return grow_draft_head(wide, max(layers, draft.config.num_hidden_layers), "identity")


def head_name(draft: Eagle3DraftModel) -> str:
    layers = draft.config.num_hidden_layers
    return f"{layers} layer{'s' if layers > 1 else ''}, MLP {draft.config.intermediate_size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated TOTALxDEPTHxTOPK")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--prompt-words", type=int, default=160, help="length of the user message in words")
    parser.add_argument(
        "--draft-vocab-size", type=int, default=None, help="head vocabulary (default: the target's, 49152)"
    )
    parser.add_argument("--head", default=None, help="a trained head's folder (default: an untrained head)")
    parser.add_argument(
        "--mt-bench", type=int, default=0, help="prompts: the first turns of this many MT-bench questions"
    )
    parser.add_argument(
        "--draft-dtypes", nargs="+", default=["auto"], help="dtypes the head drafts in (tree_draft_dtype), each timed"
    )
    parser.add_argument("--lookup-tokens", type=int, default=0, help="prompt-lookup tokens per tree")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="LAYERSxMLP",
        help="with --head: also time copies of it with LAYERS layers and MLP times its MLP width (same tau)",
    )
    parser.add_argument(
        "--pack-weights",
        default="off",
        choices=["auto", "on", "off"],
        help="MKL-pack weights (eagle3_hf.generation.cpu_packing)",
    )
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for dtype in args.draft_dtypes:
        check_draft_dtype(parser, "--draft-dtypes", dtype)
    if args.variants and args.head is None:
        parser.error("--variants grows and widens a trained head: pass --head")
    try:
        variants = [tuple(int(v) for v in spec.split("x")) for spec in args.variants or []]
    except ValueError:
        parser.error(f"--variants {args.variants}: expected LAYERSxMLP pairs of integers, e.g. 2x1 1x2")
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.head is not None and args.draft_vocab_size is not None:
        parser.error("--draft-vocab-size is for the untrained head; --head brings its own vocabulary")
    if args.head is not None:
        target, tokenizer, draft = load_default_pair(args.head)
    else:
        target, tokenizer = load_target()
        overrides = {} if args.draft_vocab_size is None else {"draft_vocab_size": args.draft_vocab_size}
        draft = Eagle3DraftModel.from_target(target, **overrides)
    # No EOS: every run produces exactly `--new-tokens` tokens, with no logits processor in either loop.
    target.generation_config.eos_token_id = None
    target_rows, draft_rows = rows_for_trees([(*shape, args.lookup_tokens) for shape in shapes])
    packing = pack_for_decoding(target, draft, target_rows, draft_rows, args.pack_weights)
    heads = {head_name(draft): draft}
    for layers, mlp_multiple in variants:
        head = head_variant(draft, layers, mlp_multiple)
        if args.pack_weights != "off" and is_packable_target(target):
            pack_rows(head, draft_rows, measure=args.pack_weights == "auto")
        heads[head_name(head)] = head
    runs_of = [(name, shape, dtype) for name in heads for shape in shapes for dtype in args.draft_dtypes]
    if args.mt_bench:
        messages = [prompt.turns[0] for prompt in load_mt_bench(limit=args.mt_bench, num_turns=1)]
    else:
        words = (PARAGRAPH * 20).split()[: args.prompt_words]
        messages = ["Summarise this text in two sentences: " + " ".join(words)]
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": message}], target.device) for message in messages]
    print(
        f"{len(prompts)} prompt(s) of {min(p.shape[1] for p in prompts)}-{max(p.shape[1] for p in prompts)} tokens, "
        f"{args.new_tokens} new tokens, {args.lookup_tokens} lookup tokens, draft vocabulary "
        f"{draft.config.draft_vocab_size}, torch threads "
        f"{torch.get_num_threads()}, {packing}, load average {os.getloadavg()[0]:.1f}"
    )

    for head in heads.values():  # warm-up (and generate's one-time choices: draft dtype, packing)
        target.generate(prompts[0], assistant_model=head, max_new_tokens=4)
    plain, runs, taus = [], {run: {} for run in runs_of}, {run: [] for run in runs_of}
    for _ in range(args.repeats):
        for input_ids in prompts:
            plain.extend(plain_step_seconds(target, input_ids, args.new_tokens))
            for run in runs_of:
                name, shape, dtype = run
                timings, tau = tree_round_seconds(
                    target, heads[name], input_ids, args.new_tokens, shape, dtype, args.lookup_tokens
                )
                for part, values in timings.items():
                    runs[run].setdefault(part, []).extend(values)
                taus[run].append(tau)
    # Other processes only ever slow a step down, so the fastest of many comparable steps (or rounds, or parts)
    # estimates the undisturbed cost; the median shows how noisy the machine was.
    step, mean_step = min(plain), statistics.mean(plain)
    print(
        f"\nplain greedy step: {step * 1000:.1f} ms fastest, {statistics.median(plain) * 1000:.1f} ms median, "
        f"{mean_step * 1000:.1f} ms mean\n"
    )
    print(
        "| head | total x depth x top_k | head drafts in | round ms (median) | round / step | grow | verify "
        "| draft update | other | mean round ms: grow + verify + update + other | mean round / mean step | tau |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs_of:
        name, shape, dtype = run
        ms = {part: min(values) * 1000 for part, values in runs[run].items()}
        mean = {part: statistics.mean(values) * 1000 for part, values in runs[run].items()}
        parts = " + ".join(f"{mean[part]:.1f}" for part in ("grow", "verify", "draft_update", "other"))
        print(
            f"| {name} | {'x'.join(map(str, shape))} | {dtype} "
            f"| {ms['round']:.1f} ({statistics.median(runs[run]['round']) * 1000:.0f}) "
            f"| {ms['round'] / 1000 / step:.2f} | {ms['grow']:.1f} | {ms['verify']:.1f} | {ms['draft_update']:.1f} "
            f"| {ms['other']:.2f} | {mean['round']:.1f}: {parts} | {mean['round'] / 1000 / mean_step:.2f} "
            f"| {statistics.mean(taus[run]):.3f} |"
        )
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
