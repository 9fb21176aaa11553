"""Cost and acceptance of the shipped head with int8 weights on CPU (a study, not a setting).

Only the target's verification decides what is emitted, so the head may run at any precision without breaking
exactness; a cheaper head only changes the speed and, through its drafts, tau. This script compares the head as
`eagle3-hf bench` runs it (float32, MKL-packed) with the same head after `torch.ao.quantization.quantize_dynamic`
(int8 weights and activations) on its decoder layer and `lm_head` (`fc` stays float32):

- the time of one head forward over `F` tree nodes after a 300-entry draft cache (median of `--repeats`);
- tau on prompts the benchmark does not use (greedy, the shipped 8 / 3 / 8 tree with 6 lookup tokens).

    .venv/bin/python scripts/measure_int8_draft.py --threads 2 --limit 8 --offset 8
"""

import argparse
import statistics
import time
import warnings

import torch
from probe_tau import probe
from transformers.cache_utils import DynamicCache

from eagle3_hf.bench.prompts import load_prompts
from eagle3_hf.generation.cpu_packing import pack_for_decoding, pack_linear_weights, rows_for_tree
from eagle3_hf.generation.gqa_attention import use_grouped_sdpa
from eagle3_hf.generation.tree import additive_mask
from eagle3_hf.loading import DEFAULT_HEAD_DIR, load_default_pair
from eagle3_hf.modeling_eagle3 import Eagle3DraftModel


SHAPE = {"tree_total_tokens": 8, "tree_depth": 3, "tree_top_k": 8, "tree_lookup_tokens": 6}
# each head drafts as it is: generate's "auto" would time (and on some CPUs use) a bfloat16 copy of it instead,
# which a quantized head cannot become
AS_IT_IS = {"tree_draft_dtype": torch.float32}


@torch.no_grad()
def head_forward_ms(draft: Eagle3DraftModel, rows: int, repeats: int, past: int = 300) -> float:
    """Median milliseconds of one head forward over `rows` tree nodes (fed hidden states) after `past` entries."""
    cache = DynamicCache(config=draft.config)
    features = torch.randn(1, past, draft.config.num_target_features)
    draft(input_ids=torch.randint(0, 1000, (1, past)), target_hidden_states=features, cache=cache, use_cache=True)
    ids, hidden = torch.randint(0, 1000, (1, rows)), torch.randn(1, rows, draft.config.hidden_size)
    mask = additive_mask(torch.ones(rows, past + rows, dtype=torch.bool), torch.float32)
    positions = torch.full((1, rows), past)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draft(
            input_ids=ids,
            hidden_states=hidden,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        times.append(time.perf_counter() - start)
        cache.crop(-rows)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "humaneval", "sharegpt"])
    parser.add_argument("--limit", type=int, default=8, help="prompts per dataset for tau")
    parser.add_argument("--offset", type=int, default=8, help="skip this many prompts of each dataset first")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8], help="tree nodes per timed head forward")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*quantiz.*")  # torch's quantized tensors warn that they are deprecated

    target, tokenizer, float_head = load_default_pair()
    int8_head = Eagle3DraftModel.from_pretrained(str(DEFAULT_HEAD_DIR), target=target).float().eval()
    torch.ao.quantization.quantize_dynamic(int8_head, {"layers", "lm_head"}, dtype=torch.qint8, inplace=True)
    target_rows, draft_rows = rows_for_tree(
        *(SHAPE[f"tree_{name}"] for name in ("total_tokens", "depth", "top_k", "lookup_tokens"))
    )
    draft_rows = sorted({*draft_rows, *args.rows} - {1})
    packing = pack_for_decoding(target, float_head, target_rows, draft_rows, "auto")
    print(packing)
    if packing.startswith("MKL"):  # the same kernels for what stayed float32 (fc)
        pack_linear_weights(int8_head, draft_rows)
        use_grouped_sdpa(int8_head)
    prompts = {name: load_prompts([name], args.limit, num_turns=1, offset=args.offset) for name in args.datasets}
    for name, head in (("float32 (packed)", float_head), ("int8 layers + lm_head", int8_head)):
        times = ", ".join(f"{rows} rows {head_forward_ms(head, rows, args.repeats):.2f} ms" for rows in args.rows)
        taus = ", ".join(
            f"{dataset} {probe(target, tokenizer, head, ps, args.max_new_tokens, {**SHAPE, **AS_IT_IS}):.3f}"
            for dataset, ps in prompts.items()
        )
        print(f"{name}: head forward {times}; tau {taus}", flush=True)


if __name__ == "__main__":
    main()
