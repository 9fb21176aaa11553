"""`eagle3-hf demo`: SmolLM2-135M-Instruct with the shipped EAGLE-3 head answers a few prompts, streaming, then
prints tau and the speedup over plain `generate` measured on the spot (no network needed)."""

import argparse

from ..loading import DEFAULT_TARGET
from . import add_pack_weights_argument
from .arguments import TARGET_HELP


DEMO_PROMPTS = [
    "Give me three tips for writing clean Python code.",
    "Explain what a hash table is in a few sentences.",
    "Write a short poem about the sea.",
]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-hf demo", description=__doc__.split("\n")[0])
    parser.add_argument("--head", default=None, help="EAGLE-3 head (folder or Hub id); default: the shipped head")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=TARGET_HELP)
    parser.add_argument("--prompts", nargs="+", default=DEMO_PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--no-stream", action="store_true", help="do not stream the text")
    add_pack_weights_argument(parser, "the tree's row counts (generate does it by default; off opts out)")
    return parser


def describe_shapes(shapes) -> str:
    """`"12 rounds 8 nodes / depth 3, 3 plain steps"`: what the planner chose, most frequent first."""
    counts: dict = {}
    for shape in shapes:
        counts[shape] = counts.get(shape, 0) + 1
    parts = [
        f"{count} plain steps"
        if shape.is_plain
        else f"{count} rounds {shape.total_tokens} nodes / depth {shape.depth}"
        for shape, count in sorted(counts.items(), key=lambda item: -item[1])
    ]
    return ", ".join(parts)


def describe_threads(counts, callers: int) -> str:
    """`"; 30 rounds on 1 thread"` for the rounds run on fewer torch threads than the caller's `callers` (a busy
    machine: `threads.ThreadChooser`), else `""`."""
    fewer: dict = {}
    for count in counts or ():
        if count < callers:
            fewer[count] = fewer.get(count, 0) + 1
    parts = [f"{n} rounds on {count} thread{'s' if count > 1 else ''}" for count, n in sorted(fewer.items())]
    return "; " + ", ".join(parts) if parts else ""


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    import torch
    from transformers import TextStreamer

    from ..bench.measure import encode_chat, timed_generate
    from ..generation.cpu_packing import is_packable_target, is_packed_for
    from ..generation.decoding import resolve_tree_settings
    from ..loading import load_default_pair

    target, tokenizer, draft = load_default_pair(args.head, target=args.target)
    tree = resolve_tree_settings(draft, None, None, None)
    lookup = f" / {tree.lookup_tokens} prompt-lookup tokens" if tree.lookup_tokens else ""
    print(
        f"generate(assistant_model=head): starts from the head's tree {tree.total_tokens} nodes / depth {tree.depth} "
        f"/ top-k {tree.top_k}{lookup} and picks each round's shape (or a plain step) from what it measures"
    )
    kwargs = {"tree_pack_weights": False} if args.pack_weights == "off" else {}
    total = {"plain": [0, 0.0], "adaptive": [0, 0.0]}
    rounds: list[int] = []
    # one short warm-up per method so the first measurement does not pay for lazy initialisation (and packing)
    warm = tokenizer("Hello", return_tensors="pt").input_ids
    for method in ("plain", "adaptive"):
        timed_generate(target, warm, method, 0.0, 8, draft, kwargs)
    if is_packed_for(target, tree.total_tokens):
        print("weights: packed weights (by generate, for the tree's rows)")
    elif args.pack_weights != "off" and is_packable_target(target):
        print("weights: stock (generate measured packing no faster on this CPU)")
    else:
        print("weights: stock")
    for prompt in args.prompts:
        input_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt}], target.device)
        print(f"\n>>> {prompt}\n")
        output = target.generate(
            input_ids,
            attention_mask=input_ids.new_ones(input_ids.shape),
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=args.max_new_tokens,
            streamer=None if args.no_stream else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
            return_dict_in_generate=True,
            **kwargs,
        )
        if args.no_stream:
            print(tokenizer.decode(output.sequences[0, input_ids.shape[1] :], skip_special_tokens=True))
        threads = describe_threads(output.round_threads, torch.get_num_threads())
        print(f"[chosen: {describe_shapes(output.round_shapes)}{threads}]")
        for method in ("plain", "adaptive"):
            measured = timed_generate(target, input_ids, method, 0.0, args.max_new_tokens, draft, kwargs)
            total[method][0] += len(measured.new_ids)
            total[method][1] += measured.seconds
            if method == "adaptive":
                rounds += measured.tokens_per_round
                tree_ids = measured.new_ids
            else:
                plain_ids = measured.new_ids
        if not (len(tree_ids) == len(plain_ids) and bool((tree_ids == plain_ids).all())):
            print("ERROR: the EAGLE-3 output differs from plain generate")
            return 1
    plain_speed = total["plain"][0] / total["plain"][1]
    tree_speed = total["adaptive"][0] / total["adaptive"][1]
    tau = sum(rounds) / len(rounds) if rounds else float("nan")
    print(
        f"\nplain generate: {plain_speed:.1f} tokens/s | EAGLE-3: {tree_speed:.1f} tokens/s | tau {tau:.2f} "
        f"(tokens per target forward) | speedup {tree_speed / plain_speed:.2f}x (greedy outputs identical)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
