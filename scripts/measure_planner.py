"""Measure the adaptive default's planner: what the head's root confidence predicts, A/B against other settings,
and what its trees really gained.

Two measurements on SmolLM2-135M-Instruct with the shipped head, 96 new tokens per prompt:

- `buckets`: rounds of the head's fixed tuned shape, grouped by the root confidence the planner is told
  (`RoundPlanner.choose(confidence=)`, `record_tree(confidence=)`): tokens per round in each confidence bucket.
  A planner that always answers the fixed shape records them through the public `tree_planner=` protocol.
- `gating`: plain `generate`, the adaptive default, and the same planner with other `PlannerConfig` fields
  (`--against`, by default `use_confidence=False`: the planner kept blind, as before confidence gating), interleaved
  prompt by prompt with rotating order; speedups with their 95% paired bootstrap intervals
  (`bench.measure.speedup_interval`), and for both planners what their tree rounds really gained: the tokens
  they produced against the plain steps their seconds would have paid for (from `Eagle3GenerateOutput`'s
  `round_seconds`, `round_shapes` and `num_accepted_tokens`), as a share of all the planner's time.

    .venv/bin/python scripts/measure_planner.py --dataset mt_bench --temperature 1 --limit 16
    .venv/bin/python scripts/measure_planner.py --measure gating --against use_gain_account=false
    .venv/bin/python scripts/measure_planner.py --dataset sharegpt --measure gating --ignore-eos
"""

import argparse
import dataclasses
import json
import time

import torch

from eagle3_hf.bench.measure import GenerationRecord, encode_chat, speedup_interval
from eagle3_hf.bench.prompts import load_prompts
from eagle3_hf.generation.cost_model import CONFIDENCE_EDGES, PlannerConfig, TreeShape, confidence_bucket
from eagle3_hf.generation.decoding import new_planner, resolve_tree_settings
from eagle3_hf.loading import load_default_pair


class FixedShapeRecorder:
    """A `tree_planner` that always answers one shape and keeps `(root confidence, tokens)` of every tree round."""

    def __init__(self, shape: TreeShape):
        self.shape, self.rounds = shape, []

    def choose(self, confidence=None):
        return self.shape

    def record_plain(self, seconds):
        pass

    def record_deferred_update(self, seconds, tokens):
        pass

    def record_tree(self, shape, accepted, tree_depth, *seconds, confidence=None, blind=True):
        self.rounds.append((confidence, accepted + 1))


def sampling_kwargs(temperature: float) -> dict:
    return dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)


def length_kwargs(max_new_tokens: int, ignore_eos: bool) -> dict:
    """Exactly `max_new_tokens` with `ignore_eos` (the end of turn is masked, for every method alike): sampled
    answers of different lengths (an early end of turn puts the prompt's prefill on a few tokens) scatter the
    per-prompt ratios far more than the decoding does."""
    return dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if ignore_eos else 0)


def measure_buckets(target, tokenizer, draft, prompts, temperature: float, max_new_tokens: int) -> None:
    settings = resolve_tree_settings(draft, None, None, None)
    recorder = FixedShapeRecorder(TreeShape(settings.total_tokens, settings.depth))
    for index, prompt in enumerate(prompts):
        input_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}], target.device)
        torch.manual_seed(index)
        target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            assistant_model=draft,
            tree_planner=recorder,
            max_new_tokens=max_new_tokens,
            **sampling_kwargs(temperature),
        )
    rounds = recorder.rounds
    edges = (0.0, *CONFIDENCE_EDGES, 1.0)
    print(f"{len(rounds)} rounds of {recorder.shape}, tau {sum(t for _, t in rounds) / len(rounds):.2f}")
    print("| root confidence | rounds | tokens per round |\n|---|---|---|")
    for bucket in range(len(edges) - 1):
        tokens = [t for confidence, t in rounds if confidence_bucket(confidence) == bucket]
        if tokens:
            span = f"{edges[bucket]:.1f}-{edges[bucket + 1]:.1f}"
            print(f"| {span} | {len(tokens)} | {sum(tokens) / len(tokens):.2f} |")


def planner_config(overrides: list[str]) -> PlannerConfig:
    """`PlannerConfig` with `FIELD=VALUE` overrides (booleans as true/false, numbers as numbers)."""
    defaults = dataclasses.asdict(PlannerConfig())
    values = {}
    for override in overrides:
        name, _, text = override.partition("=")
        if name not in defaults:
            raise SystemExit(
                f"--against {override}: PlannerConfig has no field {name!r} (fields: {sorted(defaults)})."
            )
        kind = type(defaults[name])
        values[name] = text.lower() in ("1", "true", "yes") if kind is bool else kind(text)
    return PlannerConfig(**values)


class RoundTally:
    """Per-round totals of one method's generations: plain steps' seconds, and the trees' seconds and tokens."""

    def __init__(self):
        self.plain_seconds, self.plain_steps = 0.0, 0
        self.tree_seconds, self.tree_tokens, self.trees = 0.0, 0, 0
        self.generation_seconds = 0.0

    def add(self, output, seconds: float) -> None:
        phases = output.round_seconds
        for index, (shape, tokens) in enumerate(zip(output.round_shapes, output.num_accepted_tokens.tolist())):
            round_seconds = sum(values[index] for values in phases.values())
            if shape.is_plain:
                self.plain_seconds, self.plain_steps = self.plain_seconds + round_seconds, self.plain_steps + 1
            else:
                self.tree_seconds, self.tree_tokens = self.tree_seconds + round_seconds, self.tree_tokens + tokens
                self.trees += 1
        self.generation_seconds += seconds

    def summary(self) -> str:
        """Tree rounds and what they gained against the mean plain step of these same generations."""
        rounds = self.plain_steps + self.trees
        text = f"tree rounds {self.trees} of {rounds} ({self.trees / max(rounds, 1):.0%})"
        if not self.trees or not self.plain_steps:
            return text
        plain_step = self.plain_seconds / self.plain_steps
        worth = self.tree_seconds / plain_step
        gain = (self.tree_tokens - worth) * plain_step / self.generation_seconds
        return (
            f"{text}: {self.tree_tokens} tokens in the time of {worth:.1f} plain steps of {plain_step * 1000:.1f} ms,"
            f" {gain:+.2%} of the time gained"
        )


def measure_gating(
    target, tokenizer, draft, prompts, temperature: float, lengths: dict, against: list[str]
) -> list[GenerationRecord]:
    other = new_planner(target, resolve_tree_settings(draft, None, None, None), planner_config(against))
    methods = {"plain": {}, "adaptive": dict(assistant_model=draft), "against": dict(assistant_model=draft)}
    methods["against"]["tree_planner"] = other
    print(f"against: the default planner with {' '.join(against)}")
    records = []
    rounds = {name: RoundTally() for name in methods}
    for index, prompt in enumerate([prompts[0], *prompts]):  # the first is a warm-up
        input_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}], target.device)
        names = list(methods)
        for name in names[index % 3 :] + names[: index % 3]:
            torch.manual_seed(index)
            begin = time.perf_counter()
            output = target.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                return_dict_in_generate=True,
                **lengths,
                **sampling_kwargs(temperature),
                **methods[name],
            )
            seconds = time.perf_counter() - begin
            if index == 0:
                continue
            new_tokens = output.sequences.shape[1] - input_ids.shape[1]
            shapes = getattr(output, "round_shapes", None)
            record = GenerationRecord("", str(index), "", 0, name, temperature, 0, new_tokens, seconds)
            if shapes is not None:
                record.tokens_per_round = output.num_accepted_tokens.tolist()
                record.round_shapes = [(shape.total_tokens, shape.depth) for shape in shapes]
                rounds[name].add(output, seconds)
            records.append(record)
    by_method = {name: [r for r in records if r.method == name] for name in methods}
    speed = {name: sum(r.new_tokens for r in rs) / sum(r.seconds for r in rs) for name, rs in by_method.items()}
    for name in ("adaptive", "against"):
        interval = _interval_text(by_method[name], by_method["plain"])
        print(f"{name}: {speed[name] / speed['plain']:.3f}x plain{interval}; {rounds[name].summary()}")
    interval = _interval_text(by_method["adaptive"], by_method["against"])
    print(f"adaptive / against: {speed['adaptive'] / speed['against']:.3f}{interval}")
    return records


def _interval_text(method: list[GenerationRecord], reference: list[GenerationRecord]) -> str:
    """` (low-high)`: the 95% paired bootstrap interval, or nothing with fewer than 3 prompts."""
    interval = speedup_interval(method, reference)
    return "" if interval is None else f" ({interval[0]:.3f}-{interval[1]:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mt_bench", choices=["mt_bench", "humaneval", "sharegpt"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measure", nargs="+", default=["buckets", "gating"], choices=["buckets", "gating"])
    parser.add_argument(
        "--against",
        nargs="+",
        default=["use_confidence=false"],
        help="PlannerConfig FIELD=VALUE overrides of the planner the default is compared with",
    )
    parser.add_argument("--output", help="JSON file for the gating runs' per-generation records")
    parser.add_argument("--ignore-eos", action="store_true", help="gating: generate exactly --max-new-tokens")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer, draft = load_default_pair()
    prompts = load_prompts([args.dataset], limit=args.limit, num_turns=1)
    eos = " (end of turn ignored)" if args.ignore_eos else ""
    print(f"{args.dataset}, T={args.temperature:g}, {len(prompts)} prompts, {args.max_new_tokens} new tokens{eos}")
    if "buckets" in args.measure:
        measure_buckets(target, tokenizer, draft, prompts, args.temperature, args.max_new_tokens)
    if "gating" in args.measure:
        records = measure_gating(
            target,
            tokenizer,
            draft,
            prompts,
            args.temperature,
            length_kwargs(args.max_new_tokens, args.ignore_eos),
            args.against,
        )
        if args.output:
            with open(args.output, "w", encoding="utf-8") as file:
                json.dump([dataclasses.asdict(record) for record in records], file, indent=1)


if __name__ == "__main__":
    main()
