"""Speed benchmark: plain `generate`, prompt lookup, chain mode, the EAGLE-3 tree (alone and with prompt-lookup
branches), interleaved prompt by prompt.

Every method is measured the same way: wall time of `target.generate(...)` and a forward pre-hook on the target
that records the committed length at each target forward, from which the tokens produced per round (accepted + 1)
follow for any decoding method. tau = new tokens / target forwards after the prefill (the bonus token counts, as in
the EAGLE papers); speedup = tokens per second over plain `generate`'s tokens per second on the same prompts.
"""

import math
import random
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

from .prompts import EvalPrompt


METHODS = ("plain", "prompt_lookup", "chain", "tree", "tree_lookup", "adaptive")
# the methods whose rounds are draft-and-verify rounds of the head ("adaptive" mixes in plain steps: 1-token rounds)
TREE_METHODS = ("tree", "tree_lookup", "chain", "adaptive")
PROMPT_LOOKUP_NUM_TOKENS = 10
TREE_LOOKUP_TOKENS = 4  # "tree_lookup": the EAGLE-3 tree with up to 4 prompt-lookup tokens grafted on


@dataclass
class GenerationRecord:
    """One measured generation (one turn of one prompt by one method)."""

    dataset: str
    prompt_id: str
    category: str
    turn: int
    method: str
    temperature: float
    prompt_tokens: int
    new_tokens: int
    seconds: float
    tokens_per_round: list[int] = field(default_factory=list)
    matches_plain: bool | None = None
    # `(total_tokens, depth)` of each EAGLE-3 round, depth 0 a plain step (`None` for methods without the head's
    # rounds): which shapes the adaptive default chose, and how often it drafted at all
    round_shapes: list[tuple[int, int]] | None = None
    # the head's root confidence of each of those rounds (`Eagle3GenerateOutput.round_confidences`)
    round_confidences: list[float | None] | None = None
    # the torch thread count of each of those rounds (`Eagle3GenerateOutput.round_threads`), and the caller's
    round_threads: list[int] | None = None
    threads: int | None = None


class TimedGeneration(NamedTuple):
    """One generation measured by `timed_generate`."""

    new_ids: torch.Tensor  # (new_tokens,)
    seconds: float
    tokens_per_round: list[int]  # accepted + 1 per round after the prefill
    round_shapes: list[tuple[int, int]] | None  # `GenerationRecord.round_shapes`
    round_confidences: list[float | None] | None = None  # `GenerationRecord.round_confidences`
    round_threads: list[int] | None = None  # `GenerationRecord.round_threads`


@contextmanager
def record_rounds(target: torch.nn.Module):
    """Yield a list that receives the cache length seen by every target forward while the block runs.

    The difference between consecutive lengths is the number of tokens committed by a round (accepted + bonus).
    """
    lengths: list[int] = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        lengths.append(cache.get_seq_length() if cache is not None else 0)

    handle = target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield lengths
    finally:
        handle.remove()


class StepClock(BaseStreamer):
    """A streamer that only timestamps `put`: once for the prompt, then once per plain step or per round (tree,
    chain and plain decoding alike). Every loop moves the tokens to the host before `put`, so each stamp follows
    the device work of its step."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass

    def intervals(self, skip_last: int = 0) -> list[float]:
        """Seconds between consecutive steps or rounds (the prompt and the prefill token are not steps), the last
        `skip_last` left out."""
        gaps = [later - earlier for earlier, later in zip(self.times[1:], self.times[2:])]
        return gaps[: len(gaps) - skip_last] if skip_last else gaps


def tokens_per_round(cache_lengths: list[int], final_length: int, prompt_length: int | None = None) -> list[int]:
    """Tokens committed per decoding round from the cache length at each target forward.

    The first forward is the prefill and emits the first new token; round `i` is the forward at index `i` and
    commits the tokens up to the start of the next forward (the last round up to `final_length`, the sequence
    length after generation; the last committed token is never in the cache). The rounds sum to new tokens - 1.

    Transformers' prompt lookup already drafts in its first forward. With `prompt_length`, a first forward that
    commits `c > 1` tokens counts as the prefill (its first token, the one the target would emit anyway) followed by
    a round of the other `c - 1` (the draft from position 2 on, which was drafted after a correct first token); a
    first forward that commits 1 token is the prefill alone, as for plain `generate`, chain mode and the tree.
    """
    if not cache_lengths:
        return []
    starts = cache_lengths[1:]
    ends = starts[1:] + [final_length - 1]
    rounds = [end - start for start, end in zip(starts, ends)]
    if prompt_length is None:
        return rounds
    first = (starts[0] if starts else final_length - 1) - prompt_length + 1  # tokens the first forward committed
    return [first - 1, *rounds] if first > 1 else rounds


def resolve_tree_lookup_tokens(draft, requested: int | None = None) -> int:
    """The prompt-lookup tokens the `"tree_lookup"` method grafts onto each tree: `requested`, else the head's
    `generation_config.tree_lookup_tokens` when positive, else `TREE_LOOKUP_TOKENS`.

    The one place this default is decided: `method_kwargs` and `eagle3-hf bench` (which packs weights for the
    rows the lookup chains add) both call it. A `requested` value below 1 is an error, since `"tree_lookup"` with no
    lookup tokens would silently be `"tree"`.
    """
    from ..generation.decoding import resolve_tree_settings

    if requested is not None:
        if not isinstance(requested, int) or requested < 1:
            raise ValueError(
                f"tree_lookup_tokens={requested!r}: the tree_lookup method needs a positive int "
                '(use the "tree" method for the tree alone).'
            )
        return requested
    return resolve_tree_settings(draft, None, None, None).lookup_tokens or TREE_LOOKUP_TOKENS


def method_kwargs(
    method: str, draft, tree_kwargs: dict | None, prompt_lookup_num_tokens: int = PROMPT_LOOKUP_NUM_TOKENS
) -> dict:
    """The `generate` keyword arguments that select a decoding method.

    `"tree"` is the EAGLE-3 tree alone (`tree_lookup_tokens=0`, whatever the head's generation config says);
    `"tree_lookup"` grafts `resolve_tree_lookup_tokens(draft, tree_kwargs.get("tree_lookup_tokens"))` prompt-lookup
    tokens onto it; both pin that shape for every round. `"adaptive"` is what `generate(assistant_model=head)` does
    with no tree argument: the cost model picks each round's shape, plain steps included, starting from the head's
    tuned shape (or from the shape `tree_kwargs` names).
    """
    tree_kwargs = tree_kwargs or {}
    if method == "plain":
        return {}
    if method == "prompt_lookup":
        return {"prompt_lookup_num_tokens": prompt_lookup_num_tokens}
    if method == "chain":
        return {"assistant_model": draft, "eagle3_mode": "chain"}
    if method == "tree":
        return {"assistant_model": draft, **tree_kwargs, "tree_lookup_tokens": 0, "tree_adaptive": False}
    if method == "tree_lookup":
        lookup = resolve_tree_lookup_tokens(draft, tree_kwargs.get("tree_lookup_tokens"))
        return {"assistant_model": draft, **tree_kwargs, "tree_lookup_tokens": lookup, "tree_adaptive": False}
    if method == "adaptive":
        return {"assistant_model": draft, **tree_kwargs, "tree_adaptive": True}
    raise ValueError(f"Unknown method {method!r}; choose from {METHODS}.")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(
    target,
    input_ids: torch.Tensor,
    method: str,
    temperature: float,
    max_new_tokens: int,
    draft=None,
    tree_kwargs: dict | None = None,
    seed: int = 0,
) -> TimedGeneration:
    """Run one generation and measure it (see [`TimedGeneration`])."""
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    kwargs = dict(max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(input_ids), **sampling)
    kwargs.update(method_kwargs(method, draft, tree_kwargs))
    if "assistant_model" in kwargs:  # the head's output records each round's shape; plain `generate` is left as is
        kwargs["return_dict_in_generate"] = True
    torch.manual_seed(seed)
    _synchronize(input_ids.device)
    with record_rounds(target) as lengths:
        start = time.perf_counter()
        output = target.generate(input_ids, **kwargs)
        _synchronize(input_ids.device)
        seconds = time.perf_counter() - start
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    rounds = tokens_per_round(lengths, sequences.shape[1], input_ids.shape[1])
    shapes = getattr(output, "round_shapes", None)
    shapes = None if shapes is None else [(shape.total_tokens, shape.depth) for shape in shapes]
    confidences = getattr(output, "round_confidences", None)
    confidences = None if confidences is None else list(confidences)
    threads = getattr(output, "round_threads", None)
    threads = None if threads is None else list(threads)
    return TimedGeneration(sequences[0, input_ids.shape[1] :], seconds, rounds, shapes, confidences, threads)


def encode_chat(tokenizer, messages: list[dict], device) -> torch.Tensor:
    """`(1, prompt_length)` input ids of `messages` with the generation prompt (plain joined text without a chat
    template), as every method of the benchmark receives them."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(message["content"] for message in messages)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)


def run_benchmark(
    target,
    tokenizer,
    draft,
    prompts: list[EvalPrompt],
    methods=METHODS,
    temperatures=(0.0,),
    max_new_tokens: int = 128,
    tree_kwargs: dict | None = None,
    seed: int = 0,
    warmup: int = 1,
    progress: bool = True,
) -> list[GenerationRecord]:
    """Measure every method on every prompt and temperature, interleaved prompt by prompt.

    The method order rotates with the prompt index so that no method always runs first (caches, clocks). Each
    method keeps its own multi-turn history (answers are fed back). At temperature 0, every method's output is
    compared with plain `generate`'s (`matches_plain`).
    """
    methods = list(methods)
    if "plain" not in methods:
        raise ValueError("methods must include 'plain': speedups are measured against it.")
    device = target.device
    if warmup and prompts:
        warm_ids = encode_chat(tokenizer, [{"role": "user", "content": prompts[0].turns[0]}], device)
        for method in methods:
            for _ in range(warmup):
                timed_generate(target, warm_ids, method, 0.0, min(16, max_new_tokens), draft, tree_kwargs, seed)
    records: list[GenerationRecord] = []
    total = sum(len(p.turns) for p in prompts) * len(temperatures)
    bar = tqdm(total=total, desc="benchmark", disable=not progress)
    for index, prompt in enumerate(prompts):
        for temperature in temperatures:
            histories = {method: [] for method in methods}
            for turn, question in enumerate(prompt.turns):
                order = methods[index % len(methods) :] + methods[: index % len(methods)]
                outputs = {}
                for method in order:
                    history = histories[method] + [{"role": "user", "content": question}]
                    input_ids = encode_chat(tokenizer, history, device)
                    measured = timed_generate(
                        target, input_ids, method, temperature, max_new_tokens, draft, tree_kwargs, seed + index
                    )
                    new_ids = outputs[method] = measured.new_ids
                    answer = tokenizer.decode(new_ids, skip_special_tokens=True)
                    histories[method] = history + [{"role": "assistant", "content": answer}]
                    records.append(
                        GenerationRecord(
                            prompt.dataset,
                            prompt.prompt_id,
                            prompt.category,
                            turn,
                            method,
                            temperature,
                            input_ids.shape[1],
                            len(new_ids),
                            measured.seconds,
                            measured.tokens_per_round,
                            round_shapes=measured.round_shapes,
                            round_confidences=measured.round_confidences,
                            round_threads=measured.round_threads,
                            threads=torch.get_num_threads(),
                        )
                    )
                if temperature == 0:
                    for record in records[-len(methods) :]:
                        record.matches_plain = torch.equal(outputs[record.method], outputs["plain"])
                bar.update(1)
    bar.close()
    return records


def acceptance_by_position(
    rounds: list[int], max_positions: int | None = None, draftable: list[int] | None = None
) -> list[float]:
    """Acceptance rate of draft position k (1-based): P(accepted >= k | accepted >= k - 1), from tokens per round.

    `rounds` holds accepted + 1 per round. `max_positions` is the deepest position the method drafts (without it,
    the deepest position any round accepted plus one, which reports a made-up 0 past a method's deepest draft).
    `draftable[i]`, when given, is the most positions round `i` could draft (`round_draft_limits`): a round cut
    short by `max_new_tokens` did not attempt the positions beyond it, so they do not count as rejections.
    Positions never attempted are omitted.
    """
    accepted = torch.tensor([r - 1 for r in rounds], dtype=torch.long)
    limits = torch.tensor(draftable, dtype=torch.long) if draftable is not None else None
    rates = []
    limit = max_positions or (int(accepted.max()) + 1 if accepted.numel() else 0)
    for k in range(1, limit + 1):
        attempted = accepted >= k - 1
        if limits is not None:
            attempted &= limits >= k
        reached = int(attempted.sum())
        if reached == 0:
            break
        rates.append(int((attempted & (accepted >= k)).sum()) / reached)
    return rates


def round_draft_limits(record: GenerationRecord, max_new_tokens: int) -> list[int]:
    """The most draft positions each round of `record` could fill under `max_new_tokens`: every method drafts at
    most `remaining - 1` tokens, the target adding one (the tree's depth, chain mode's candidates, prompt lookup).

    The tokens emitted before the first recorded round (the prefill's one) are `new_tokens - sum(rounds)`.
    """
    emitted = record.new_tokens - sum(record.tokens_per_round)
    limits = []
    for tokens in record.tokens_per_round:
        limits.append(max_new_tokens - emitted - 1)
        emitted += tokens
    return limits


def deepest_draft_positions(tree, sampled: bool) -> dict[str, int]:
    """The deepest draft position of every method (`TREE_METHODS` and prompt lookup) for the tree settings `tree`
    (a `TreeSettings` whose `lookup_tokens` is the `"tree_lookup"` method's), `sampled` when the tree is sampled.

    The tree reaches `depth` (at most `total_tokens - 1` nodes deep); `"tree_lookup"` also adds a prompt-lookup
    chain from the root, as long as `lookup_tokens` but no longer than the tree has room for
    (`TreeSettings.lookup_room`).
    """
    from ..generation.candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS

    tree_depth = min(tree.depth, tree.total_tokens - 1)
    return {
        "prompt_lookup": PROMPT_LOOKUP_NUM_TOKENS,
        "chain": DEFAULT_NUM_ASSISTANT_TOKENS,
        "tree": tree_depth,
        "tree_lookup": max(tree_depth, min(tree.lookup_tokens, tree.lookup_room(sampled))),
    }


def _aggregate(
    group: list[GenerationRecord], max_new_tokens: int | None = None, max_positions: int | None = None
) -> dict:
    new_tokens = sum(r.new_tokens for r in group)
    seconds = sum(r.seconds for r in group)
    rounds = [t for r in group for t in r.tokens_per_round]
    draftable = None
    if max_new_tokens is not None:
        draftable = [limit for r in group for limit in round_draft_limits(r, max_new_tokens)]
    checked = [r.matches_plain for r in group if r.matches_plain is not None]
    shapes = [shape for r in group if r.round_shapes is not None for shape in r.round_shapes]
    fewer = [count < r.threads for r in group if r.round_threads and r.threads for count in r.round_threads]
    return {
        "generations": len(group),
        "new_tokens": new_tokens,
        "seconds": round(seconds, 4),
        "tokens_per_second": new_tokens / seconds if seconds else 0.0,
        "tau": sum(rounds) / len(rounds) if rounds else None,
        "rounds": len(rounds),
        "acceptance_by_position": acceptance_by_position(rounds, max_positions, draftable) if rounds else [],
        "greedy_mismatches": checked.count(False) if checked else None,  # None: no output compared (T > 0)
        # the share of the head's rounds that verified a draft (the rest: the adaptive default's plain steps)
        "tree_round_share": sum(depth > 0 for _, depth in shapes) / len(shapes) if shapes else None,
        # the share of them run on fewer torch threads than the caller's (`threads.ThreadChooser`: a busy machine)
        "fewer_threads_share": sum(fewer) / len(fewer) if fewer else None,
    }


def speedup_interval(
    method: list[GenerationRecord], plain: list[GenerationRecord], resamples: int = 2000, level: float = 0.95
) -> tuple[float, float] | None:
    """A paired bootstrap confidence interval of `method`'s speedup over `plain` (tokens per second over tokens per
    second, as `summarize` computes it), resampling the prompts: each resample draws as many prompts as were
    measured, with replacement, and takes both methods' generations of the drawn prompts. `None` with fewer than
    3 prompts measured by both.

    Timings of the same prompt move together (its length, the machine's state at that moment), and at T > 0 each
    method also samples its own text, so two runs of one method on 16 prompts differ by a few percent: the interval
    says whether a speedup near 1.0x is one.
    """
    by_prompt: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for records, offset in ((method, 0), (plain, 2)):
        for record in records:
            totals = by_prompt[(record.prompt_id, record.turn)]
            totals[offset] += record.new_tokens
            totals[offset + 1] += record.seconds
    pairs = [totals for totals in by_prompt.values() if totals[1] > 0 and totals[3] > 0]
    if len(pairs) < 3:
        return None
    rng = random.Random(0)  # the same records give the same interval
    ratios = []
    for _ in range(resamples):
        tokens, seconds, plain_tokens, plain_seconds = map(sum, zip(*rng.choices(pairs, k=len(pairs))))
        ratios.append((tokens / seconds) / (plain_tokens / plain_seconds) if plain_tokens else math.nan)
    ratios = sorted(ratio for ratio in ratios if not math.isnan(ratio))
    tail = (1 - level) / 2
    return ratios[int(tail * (len(ratios) - 1))], ratios[math.ceil((1 - tail) * (len(ratios) - 1))]


def summarize(records: list[GenerationRecord], max_new_tokens: int | None = None, tree=None) -> dict:
    """Per (dataset, temperature, method) and per MT-bench category: tau, tokens/s, speedup (with its 95% paired
    bootstrap interval over prompts, `speedup_interval`), acceptance.

    tau is the reference's: new tokens per round, so a last round cut short by `max_new_tokens` counts with the
    tokens it emitted. Acceptance by position leaves out the positions such a round could not draft when
    `max_new_tokens` (the run's) is given, and ends at each method's deepest draft position when `tree` (the run's
    `TreeSettings`, `lookup_tokens` the `"tree_lookup"` method's; sampled trees at temperature > 0) is given.
    """
    groups: dict[tuple, list[GenerationRecord]] = defaultdict(list)
    for record in records:
        groups[(record.dataset, record.temperature, record.method)].append(record)
        if record.dataset == "mt_bench":
            groups[(f"mt_bench/{record.category}", record.temperature, record.method)].append(record)
    rows = []
    for (dataset, temperature, method), group in sorted(groups.items()):
        deepest = deepest_draft_positions(tree, temperature > 0).get(method) if tree is not None else None
        row = {
            "dataset": dataset,
            "temperature": temperature,
            "method": method,
            **_aggregate(group, max_new_tokens, deepest),
        }
        plain = groups.get((dataset, temperature, "plain"))
        plain_speed = _aggregate(plain)["tokens_per_second"] if plain else 0.0
        row["speedup"] = row["tokens_per_second"] / plain_speed if plain_speed else None
        interval = speedup_interval(group, plain) if plain and method != "plain" else None
        row["speedup_interval"] = list(interval) if interval else None
        rows.append(row)
    return {"rows": rows, "records": [asdict(r) for r in records]}
