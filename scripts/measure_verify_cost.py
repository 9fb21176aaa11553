"""Cost of one SmolLM2-135M-Instruct forward over N new tokens (a tree verification), stock vs MKL-packed weights.

The target holds a 200-token prefix in its cache; each measurement feeds N random tokens, keeps the fastest of six
runs (other processes only ever slow a run down) and crops the cache back. Packed weights are
`eagle3_hf.pack_linear_weights(target, N values)`; N = 1 is never packed (the stock one-row kernel is used).

    .venv/bin/python scripts/measure_verify_cost.py --threads 2
"""

import argparse
import time

import torch
from transformers.cache_utils import DynamicCache

from eagle3_hf import pack_linear_weights
from eagle3_hf.assets import load_smollm2


def forward_ms(target, prefix: torch.LongTensor, num_new: int, repeats: int = 6) -> float:
    with torch.no_grad():
        cache = DynamicCache(config=target.config)
        target(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
        start = prefix.shape[1]
        ids = torch.randint(0, target.config.vocab_size, (1, num_new))
        positions = torch.arange(start, start + num_new)[None]
        best = float("inf")
        for _ in range(repeats):
            begin = time.perf_counter()
            target(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=0)
            best = min(best, time.perf_counter() - begin)
            cache.crop(-num_new)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, _ = load_smollm2()
    prefix = torch.randint(0, target.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    stock = {n: forward_ms(target, prefix, n) for n in args.sizes}
    pack_linear_weights(target, [n for n in args.sizes if n > 1])
    packed = {n: forward_ms(target, prefix, n) for n in args.sizes}
    print(
        f"torch threads {torch.get_num_threads()}; forward over N tokens after a 200-token prefix (ms, fastest of 6)"
    )
    print("| N | stock | / stock N=1 | packed | / stock N=1 |\n|---|---|---|---|---|")
    for n in args.sizes:
        print(f"| {n} | {stock[n]:.1f} | {stock[n] / stock[1]:.2f} | {packed[n]:.1f} | {packed[n] / stock[1]:.2f} |")


if __name__ == "__main__":
    main()
