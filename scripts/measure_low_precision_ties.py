"""Where greedy EAGLE-3 decoding and plain `generate` part in low precision, and how close the target's call was there.

In float32, greedy decoding through the head is bit-identical to plain `generate`. In bfloat16 it can part: a tree's
verification scores several rows in one forward, whose kernels round differently from plain decoding's one row, and
bfloat16 logits are coarse (one rounding step is 0.0625 between 8 and 16, 0.125 between 16 and 32). This script
decodes each prompt both ways with the same low-precision target and, where the outputs part, reports:

- the margin between plain's token and the tree's token in the very logits plain `generate` chose from
  (`output_logits=True`): 0 means an exact tie that `argmax` broke by token id;
- the same margin under a float32 copy of the target (one forward over plain's output): which of the two the
  full-precision model prefers;
- the share of all plain steps whose two best logits were that close (how rare such a call is).

    .venv/bin/python scripts/measure_low_precision_ties.py --dataset mt_bench --limit 8 --threads 2
"""

import argparse

import torch

from eagle3_hf.bench.measure import encode_chat
from eagle3_hf.bench.prompts import DATASETS, load_prompts
from eagle3_hf.loading import load_default_pair, load_target


def top2_margins(step_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """`(steps,)` the gap between the best and second-best logit of each plain step."""
    values = torch.stack([logits[0].float() for logits in step_logits]).topk(2, dim=-1).values
    return values[:, 0] - values[:, 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="mt_bench")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target, tokenizer, head = load_default_pair(dtype=args.dtype)
    reference, _ = load_target(dtype="float32")  # scores the two tokens only: no head needed
    margins, parted = [], []
    for number, prompt in enumerate(load_prompts([args.dataset], limit=args.limit, offset=args.offset, num_turns=1)):
        ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}], target.device)
        options = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)
        plain = target.generate(ids, output_logits=True, return_dict_in_generate=True, **options)
        tree = target.generate(ids, assistant_model=head, return_dict_in_generate=True, **options).sequences
        margins.append(top2_margins(plain.logits))
        length = min(plain.sequences.shape[1], tree.shape[1])
        differ = (plain.sequences[0, :length] != tree[0, :length]).nonzero()
        if len(differ) == 0:
            print(f"prompt {number}: identical ({plain.sequences.shape[1] - ids.shape[1]} new tokens)", flush=True)
            continue
        position = differ[0].item()
        step = position - ids.shape[1]
        chosen, other = plain.sequences[0, position].item(), tree[0, position].item()
        step_logits = plain.logits[step][0].float()
        margin = (step_logits[chosen] - step_logits[other]).item()
        with torch.no_grad():
            full = reference(plain.sequences[:, :position]).logits[0, -1]
        full_margin = (full[chosen] - full[other]).item()
        parted.append((margin, full_margin))
        print(
            f"prompt {number}: parts at new token {step}: plain {tokenizer.decode([chosen])!r}, tree "
            f"{tokenizer.decode([other])!r}; plain's {args.dtype} logits {step_logits[chosen].item():.3f} vs "
            f"{step_logits[other].item():.3f} (margin {margin:.4f}); float32 margin {full_margin:+.4f}",
            flush=True,
        )
    every = torch.cat(margins)
    print(
        f"\n{args.dataset}, {args.dtype}: {len(parted)} of {len(margins)} outputs part from plain; plain steps: "
        f"{len(every)}, median top-2 margin {every.median().item():.3f}"
    )
    for margin, full_margin in parted:
        share = (every <= margin).float().mean().item()
        prefers = "the tree's" if full_margin < 0 else "plain's"
        print(
            f"  margin {margin:.4f}: {share:.2%} of plain steps are as close; float32 prefers {prefers} token "
            f"({full_margin:+.4f})"
        )


if __name__ == "__main__":
    main()
