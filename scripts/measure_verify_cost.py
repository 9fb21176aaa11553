"""Cost of one SmolLM2-135M-Instruct forward over N new tokens (a tree verification), stock vs packed weights.

The target holds a 200-token prefix in its cache; each measurement feeds N random tokens, keeps the fastest of six
runs (other processes only ever slow a run down) and crops the cache back. Packed weights are
`eagle3_hf.pack_linear_weights(target, N values, kernel)`, one column per `--kernels` entry (MKL's packed GEMM,
oneDNN's linear on a reordered weight; default: every kernel this build has); N = 1 is never packed (the stock
one-row kernel is used). `--tree-mask` feeds the N tokens under an explicit 4-D causal mask, as a tree
verification does (a mask is what makes `sdpa` copy the keys and values per query head); `--grouped-sdpa` then
also measures `eagle3_hf.generation.gqa_attention`'s backend, which does not copy them, with the last kernel.
`--one-row-packed` also times a plain decoding step (N = 1) with every weight packed for one row by each kernel:
`generate` never does that (plain steps stay bit-identical to plain `generate`), but it shows how much of a tree's
gain over plain decoding on this CPU is the kernel's rather than speculation's.

    .venv/bin/python scripts/measure_verify_cost.py --threads 2 --tree-mask --grouped-sdpa
"""

import argparse
import time

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from eagle3_hf import pack_linear_weights, unpack_linear_weights
from eagle3_hf.generation import cpu_packing
from eagle3_hf.generation.cpu_packing import packing_kernels
from eagle3_hf.generation.gqa_attention import use_grouped_sdpa
from eagle3_hf.generation.tree import additive_mask
from eagle3_hf.loading import load_target


def forward_ms(target, prefix: torch.LongTensor, num_new: int, tree_mask: bool, repeats: int = 6) -> float:
    with torch.no_grad():
        cache = DynamicCache(config=target.config)
        target(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
        start = prefix.shape[1]
        ids = torch.randint(0, target.config.vocab_size, (1, num_new))
        positions = torch.arange(start, start + num_new)[None]
        mask = None
        if tree_mask:  # a chain is a tree: node i sees the prefix and nodes 0..i
            visible = torch.ones(num_new, start + num_new, dtype=torch.bool).tril(diagonal=start)
            mask = additive_mask(visible, target.dtype)
        best = float("inf")
        for _ in range(repeats):
            begin = time.perf_counter()
            target(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=0,
            )
            best = min(best, time.perf_counter() - begin)
            cache.crop(-num_new)
    return best * 1000


def one_row_packed_ms(target, prefix: torch.LongTensor, kernel: str) -> float:
    """A one-token step with every linear weight of `target` (unpacked) packed for one row by `kernel`."""
    packs, stock_forward = {}, nn.Linear.forward

    def packed_forward(self, x):
        if x.numel() != x.shape[-1] or torch.is_grad_enabled():
            return stock_forward(self, x)
        if self not in packs:
            packs[self] = cpu_packing.pack_weight(self.weight.detach(), 1, kernel)
        flat = x.reshape(1, self.in_features)
        return cpu_packing.packed_linear(flat, packs[self], self.weight, self.bias, kernel).reshape(*x.shape[:-1], -1)

    nn.Linear.forward = packed_forward
    try:
        return forward_ms(target, prefix, 1, tree_mask=False)
    finally:
        nn.Linear.forward = stock_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24])
    parser.add_argument("--tree-mask", action="store_true", help="pass a 4-D mask for N > 1, as tree verification")
    parser.add_argument("--grouped-sdpa", action="store_true", help="also measure packed + grouped-query SDPA")
    parser.add_argument("--kernels", nargs="+", default=packing_kernels(), choices=packing_kernels())
    parser.add_argument("--one-row-packed", action="store_true", help="also time N = 1 packed for one row")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, _ = load_target()
    prefix = torch.randint(0, target.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))

    def measure() -> dict[int, float]:  # N = 1 is a plain decoding step: never masked
        return {n: forward_ms(target, prefix, n, args.tree_mask and n > 1) for n in args.sizes}

    columns = {"stock": measure()}
    one_row = {kernel: one_row_packed_ms(target, prefix, kernel) for kernel in args.kernels if args.one_row_packed}
    for index, kernel in enumerate(args.kernels):
        if index:
            unpack_linear_weights(target)  # a row count keeps the kernel it was first packed with
        pack_linear_weights(target, [n for n in args.sizes if n > 1], kernel)
        columns[f"{kernel} packed"] = measure()
    if args.grouped_sdpa:
        use_grouped_sdpa(target)
        columns[f"{args.kernels[-1]} packed + grouped SDPA"] = measure()
    base = columns["stock"][1]
    print(
        f"torch threads {torch.get_num_threads()}; forward over N tokens after a 200-token prefix (ms, fastest of 6); "
        f"{'4-D tree mask' if args.tree_mask else 'causal, no mask'} for N > 1"
    )
    print("| N | " + " | ".join(f"{name} | / stock N=1" for name in columns) + " |")
    print("|---|" + "---|---|" * len(columns))
    for n in args.sizes:
        print(f"| {n} | " + " | ".join(f"{c[n]:.1f} | {c[n] / base:.2f}" for c in columns.values()) + " |")
    for kernel, ms in one_row.items():
        print(f"N = 1 with every weight packed for one row by {kernel}: {ms:.1f} ms ({ms / base:.2f} of stock)")


if __name__ == "__main__":
    main()
