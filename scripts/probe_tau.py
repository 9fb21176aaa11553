"""Acceptance length (tau) of EAGLE-3 heads on a few prompts, without timing: for comparing checkpoints.

Speed needs `eagle3-hf bench`; tau alone does not depend on the machine's load, so this runs next to a training job.
Each head decodes the same prompts greedily with the same tree; `--offset` keeps the probe prompts apart from the
first ones that `eagle3-hf bench --limit N` measures. `--vocab-file` first switches every head to that draft
vocabulary (`Eagle3DraftModel.replace_draft_vocab`, new rows from the target's output embedding).

    .venv/bin/python scripts/probe_tau.py model_cards/eagle3-SmolLM2-135M-Instruct runs/head/checkpoint-500 \\
        --datasets mt_bench humaneval sharegpt --offset 10 --limit 6
"""

import argparse

import torch

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.bench.prompts import load_prompts
from eagle3_hf.loading import load_target
from eagle3_hf.training.vocab import load_draft_vocab


def probe(target, tokenizer, draft, prompts, max_new_tokens: int, tree_kwargs: dict) -> float:
    """Tokens per verification round, pooled over `prompts` (greedy, first turns, chat template)."""
    accepted = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt.turns[0]}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        output = target.generate(
            **inputs,
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            return_dict_in_generate=True,
            **tree_kwargs,
        )
        accepted.extend(output.num_accepted_tokens.tolist())
    return sum(accepted) / len(accepted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", help="head folders (checkpoints work too)")
    parser.add_argument("--datasets", nargs="+", default=["mt_bench"], choices=["mt_bench", "humaneval", "sharegpt"])
    parser.add_argument("--offset", type=int, default=10, help="skip this many prompts of each dataset first")
    parser.add_argument("--limit", type=int, default=6, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--shape", default="12x3x8", help="TOTALxDEPTHxTOPK of the tree")
    parser.add_argument("--lookup-tokens", type=int, default=0, help="prompt-lookup tokens grafted per tree")
    parser.add_argument("--vocab-file", default=None, help="switch every head to this draft vocabulary first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to other jobs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    total, depth, top_k = (int(value) for value in args.shape.split("x"))
    tree_kwargs = {"tree_total_tokens": total, "tree_depth": depth, "tree_top_k": top_k}
    tree_kwargs["tree_lookup_tokens"] = args.lookup_tokens
    target, tokenizer = load_target()
    prompts = {name: load_prompts([name], args.limit, num_turns=1, offset=args.offset) for name in args.datasets}
    for head in args.heads:
        draft = Eagle3DraftModel.from_pretrained(head, target=target).float().eval()
        note = ""
        if args.vocab_file:
            added = draft.replace_draft_vocab(load_draft_vocab(args.vocab_file).token_ids, target)
            note = f" (vocabulary {draft.config.draft_vocab_size}, {added} new)"
        taus = {
            name: probe(target, tokenizer, draft, ps, args.max_new_tokens, tree_kwargs) for name, ps in prompts.items()
        }
        print(f"{head}{note}: " + ", ".join(f"{name} tau {tau:.3f}" for name, tau in taus.items()), flush=True)


if __name__ == "__main__":
    main()
