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
    add_pack_weights_argument(parser, "the tree's row counts")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    from transformers import TextStreamer

    from ..bench.measure import timed_generate
    from ..generation.cpu_packing import pack_for_decoding, rows_for_tree
    from ..generation.decoding import resolve_tree_settings
    from ..loading import load_default_pair

    target, tokenizer, draft = load_default_pair(args.head, target=args.target)
    tree = resolve_tree_settings(draft, None, None, None)
    packing = pack_for_decoding(
        target, draft, *rows_for_tree(tree.total_tokens, tree.depth, tree.top_k, tree.lookup_tokens), args.pack_weights
    )
    lookup = f" / {tree.lookup_tokens} prompt-lookup tokens" if tree.lookup_tokens else ""
    print(f"tree {tree.total_tokens} nodes / depth {tree.depth} / top-k {tree.top_k}{lookup}; {packing}")
    # the head's own settings, prompt-lookup branches included when its generation config asks for them
    tree_method = "tree_lookup" if tree.lookup_tokens else "tree"
    tree_kwargs = {"tree_lookup_tokens": tree.lookup_tokens}
    total = {"plain": [0, 0.0], tree_method: [0, 0.0]}
    rounds: list[int] = []
    # one short warm-up per method so the first measurement does not pay for lazy initialisation
    warm = tokenizer("Hello", return_tensors="pt").input_ids
    for method in ("plain", tree_method):
        timed_generate(target, warm, method, 0.0, 8, draft, tree_kwargs)
    for prompt in args.prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        input_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        print(f"\n>>> {prompt}\n")
        if not args.no_stream:
            streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            target.generate(
                input_ids,
                attention_mask=input_ids.new_ones(input_ids.shape),
                assistant_model=draft,
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                streamer=streamer,
            )
        for method in ("plain", tree_method):
            new_ids, seconds, per_round = timed_generate(
                target, input_ids, method, 0.0, args.max_new_tokens, draft, tree_kwargs
            )
            total[method][0] += len(new_ids)
            total[method][1] += seconds
            if method == tree_method:
                rounds += per_round
                tree_ids = new_ids
            else:
                plain_ids = new_ids
        if args.no_stream:
            print(tokenizer.decode(tree_ids, skip_special_tokens=True))
        if not (len(tree_ids) == len(plain_ids) and bool((tree_ids == plain_ids).all())):
            print("ERROR: the EAGLE-3 output differs from plain generate")
            return 1
    plain_speed = total["plain"][0] / total["plain"][1]
    tree_speed = total[tree_method][0] / total[tree_method][1]
    tau = sum(rounds) / len(rounds) if rounds else float("nan")
    print(
        f"\nplain generate: {plain_speed:.1f} tokens/s | EAGLE-3 tree: {tree_speed:.1f} tokens/s | "
        f"tau {tau:.2f} | speedup {tree_speed / plain_speed:.2f}x (greedy outputs identical)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
