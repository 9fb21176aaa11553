"""Root acceptance of a sampled tree when the head's draws are sharpened or flattened (a study, not a setting).

Sampled verification stays exact for any draft distribution `q`; only how often it accepts changes. This script
samples answers from SmolLM2-135M-Instruct with a head (`--head`, default: the shipped one; temperature 1, sampled
trees, no lookup), records at every round's root the target's distribution `p` and the head's
`q = softmax(logits / T)`, and then replays the root with `q_m = softmax(logits / (T * m))` for several multipliers `m`:

- one drawn child accepts with probability `sum_x min(p(x), q_m(x))` (computed exactly);
- four children drawn without replacement are verified by `tree.sample_accept` (recursive rejection sampling),
  estimated by Monte Carlo on a subset of the positions.

    .venv/bin/python scripts/measure_draft_temperature.py --limit 3 --offset 12
"""

import argparse

import torch

from eagle3_hf.bench.measure import encode_chat
from eagle3_hf.bench.prompts import load_prompts
from eagle3_hf.generation.tree import DraftTree, ancestor_matrix, sample_accept
from eagle3_hf.loading import load_default_pair


def root_distributions(target, tokenizer, draft, prompts, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(p, q)`, each `(positions, vocab_size)` float64: the target's and the head's distributions at the roots.

    The target's is the loop's own processed distribution (`output_scores`): each round's first emitted token is
    drawn from its root's row, and the prefill's token, first of all, belongs to no round.
    """
    p, q = [], []
    for index, prompt in enumerate(prompts):
        input_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}], target.device)
        torch.manual_seed(index)
        output = target.generate(
            input_ids,
            assistant_model=draft,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            tree_lookup_tokens=0,
            return_dict_in_generate=True,
            output_scores=True,
            output_draft_trees=True,
        )
        first_tokens = 1 + torch.cumsum(output.num_accepted_tokens, 0) - output.num_accepted_tokens
        for tree, first in zip(output.draft_trees, first_tokens.tolist()):
            # the last round may be a bare root (no room left to draft), or cut before its first token
            if tree.draft_probs is not None and first < len(output.scores):
                p.append(torch.softmax(output.scores[first][0].double(), dim=-1))
                q.append(tree.draft_probs[0].double())
    return torch.stack(p), torch.stack(q)


def accepts_drawn_children(p: torch.Tensor, q: torch.Tensor, k: int, trials: int) -> float:
    """Monte Carlo rate at which a root with `k` children drawn without replacement from `q` (Gumbel top-k, as
    `TreeDrafter.grow_sampled` draws them) accepts one under target `p`, verified by `tree.sample_accept`."""
    parents = torch.tensor([-1] + [0] * k)
    ancestors, depths = ancestor_matrix(parents)
    sampled = torch.tensor([False] + [True] * k)
    draft_probs = torch.cat([q[None], q.new_zeros(k, q.shape[0])])
    probs = p[None].expand(k + 1, -1)  # the children's rows only draw the bonus token, which is not counted
    accepted = 0
    for _ in range(trials):
        uniform = torch.rand(q.shape, dtype=torch.float64).clamp(min=1e-300)
        draws = (torch.log(q) - torch.log(-torch.log(uniform))).topk(k).indices
        tokens = torch.cat([torch.zeros(1, dtype=torch.long), draws])
        tree = DraftTree(tokens, parents, depths, ancestors, torch.zeros(k + 1), sampled, draft_probs)
        path, _ = sample_accept(tree, probs)
        accepted += int(path.numel() > 1)
    return accepted / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "humaneval", "sharegpt"])
    parser.add_argument("--limit", type=int, default=3, help="prompts per dataset")
    parser.add_argument("--offset", type=int, default=12, help="skip this many prompts of each dataset first")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5])
    parser.add_argument("--positions", type=int, default=120, help="positions replayed by Monte Carlo")
    parser.add_argument("--trials", type=int, default=60, help="Monte Carlo trials per position")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--head", default=None, help="head folder or Hub id (default: the shipped head)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, draft = load_default_pair(args.head)
    prompts = load_prompts(args.datasets, args.limit, offset=args.offset)
    p, q = root_distributions(target, tokenizer, draft, prompts, args.max_new_tokens)
    print(f"{p.shape[0]} root positions")
    torch.manual_seed(0)
    subset = range(0, p.shape[0], max(1, p.shape[0] // args.positions))
    for m in args.multipliers:
        q_m = q.clamp(min=1e-300) ** (1 / m) * (q > 0)  # softmax(logits / (T m)) on the head's support
        q_m = q_m / q_m.sum(dim=-1, keepdim=True)
        one = torch.minimum(p, q_m).sum(dim=-1).mean().item()
        four = sum(accepts_drawn_children(p[i], q_m[i], 4, args.trials) for i in subset) / len(subset)
        print(f"m = {m}: 1 drawn child accepts {one:.3f}, 4 drawn children {four:.3f}", flush=True)


if __name__ == "__main__":
    main()
