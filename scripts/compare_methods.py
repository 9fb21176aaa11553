"""One `eagle3-hf bench` method against another, prompt by prompt: the geometric mean of the per-prompt ratios of
tokens per second, with a 95% bootstrap interval over the prompts (the README's "adaptive / fixed" column).

    .venv/bin/python scripts/compare_methods.py \
        model_cards/eagle3-SmolLM2-135M-Instruct/benchmark/adaptive-session19/t0/results.json adaptive tree_lookup

A ratio of summed rates (what `bench`'s speedup reports) is dominated by the long answers; the geometric mean weighs
every prompt alike, which is what "within noise of the best fixed shape" asks about.
"""

import argparse
import json
import math
import random
from collections import defaultdict
from pathlib import Path


def per_prompt_log_ratios(records: list[dict], method: str, baseline: str) -> dict[tuple, list[float]]:
    """`{(dataset, temperature): [log(rate of method / rate of baseline) per prompt and turn]}`, MT-bench categories
    left out (their prompts are in `mt_bench` already)."""
    rates: dict[tuple, dict[str, float]] = defaultdict(dict)
    for record in records:
        if "/" in record["dataset"] or record["seconds"] <= 0:
            continue
        key = (record["dataset"], record["temperature"], record["prompt_id"], record["turn"])
        rates[key][record["method"]] = record["new_tokens"] / record["seconds"]
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for (dataset, temperature, *_), by_method in rates.items():
        if method in by_method and baseline in by_method:
            ratios[(dataset, temperature)].append(math.log(by_method[method] / by_method[baseline]))
    return ratios


def geometric_mean_interval(logs: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """`(geometric mean, lower, upper)` of the ratios whose logs are `logs`, by a bootstrap over them."""
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=len(logs))) / len(logs) for _ in range(resamples))
    tail = int(0.025 * (resamples - 1))
    return math.exp(sum(logs) / len(logs)), math.exp(means[tail]), math.exp(means[resamples - 1 - tail])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="`results.json` written by `eagle3-hf bench`")
    parser.add_argument("method", help="the method compared, e.g. adaptive")
    parser.add_argument("baseline", help="the method it is compared with, e.g. tree_lookup")
    args = parser.parse_args()
    records = json.loads(args.results.read_text(encoding="utf-8"))["records"]
    ratios = per_prompt_log_ratios(records, args.method, args.baseline)
    if not ratios:
        raise SystemExit(f"{args.results}: no prompt measured with both {args.method!r} and {args.baseline!r}.")
    for (dataset, temperature), logs in sorted(ratios.items()):
        mean, lower, upper = geometric_mean_interval(logs)
        print(f"{dataset} T={temperature:g}: {mean:.3f} ({lower:.3f}-{upper:.3f}), {len(logs)} prompts")


if __name__ == "__main__":
    main()
