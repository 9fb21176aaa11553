"""Evaluation prompt sets for the benchmark: MT-bench (80 questions, 8 categories), HumanEval (164 problems) and a
held-out slice of ShareGPT that training never sees.

All three come from offline packages (see `eagle3_hf.assets`); each prompt is a list of user turns.
"""

import gzip
import itertools
import json
from dataclasses import dataclass, field

from ..assets import HUMAN_EVAL, MT_BENCH


# ShareGPT records with index >= this (among the complete records of the shipped file) are held out of training.
SHAREGPT_HELDOUT_START = 17000


@dataclass(frozen=True)
class EvalPrompt:
    """One benchmark prompt: `turns` are user messages, answered one after the other (multi-turn)."""

    dataset: str
    prompt_id: str
    category: str
    turns: list[str] = field(default_factory=list)


def load_mt_bench(limit: int | None = None, num_turns: int | None = 2) -> list[EvalPrompt]:
    """MT-bench questions, categories interleaved: the first question of each category in file order, then the
    second of each, and so on; `num_turns=1` keeps only the first turn, `None` every turn.

    The file lists its 80 questions category by category (10 "writing" first), so a file-order `limit=8` would
    measure writing alone; interleaved, any `limit >= 8` covers all eight categories and `limit=80` is the whole set.
    """
    by_category: dict[str, list[EvalPrompt]] = {}
    with open(MT_BENCH.path(), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            turns = list(row["turns"])[:num_turns]
            prompt = EvalPrompt("mt_bench", str(row["question_id"]), row["category"], turns)
            by_category.setdefault(prompt.category, []).append(prompt)
    rounds = itertools.zip_longest(*by_category.values())  # dicts keep the categories in file order
    prompts = [prompt for round_ in rounds for prompt in round_ if prompt is not None]
    return prompts[:limit]


def load_human_eval(limit: int | None = None) -> list[EvalPrompt]:
    """HumanEval problems; the function signature and docstring are the single user turn, as in EAGLE's scripts."""
    prompts = []
    with gzip.open(HUMAN_EVAL.path(), "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            prompts.append(EvalPrompt("humaneval", row["task_id"], "coding", [row["prompt"]]))
    return prompts[:limit]


def load_sharegpt_heldout(
    limit: int | None = None, start: int = SHAREGPT_HELDOUT_START, source="sharegpt"
) -> list[EvalPrompt]:
    """First user turn of the held-out ShareGPT records (index >= `start`), skipping conversations without one and
    prompts already seen: ShareGPT repeats prompts under other ids ("Hello!", "continue", pasted tasks), so about
    one in twelve held-out first turns is word for word the first turn of a record before `start`, which training
    may have used. Those, and repeats within the slice, are left out (compared ignoring case and whitespace: the
    slice's "COntinue" is the earlier records' "continue").
    `source`: the shipped ShareGPT file, or any source `eagle3_hf.training.records.iter_records` reads."""
    from ..training.records import read_sharegpt_heldout_records

    seen = _first_user_turns(stop=start, source=source)
    prompts = []
    for index, record in read_sharegpt_heldout_records(start, source=source):
        turn = record["first_user_turn"]
        if _prompt_key(turn) in seen:
            continue
        seen.add(_prompt_key(turn))
        prompts.append(EvalPrompt("sharegpt", str(record.get("id", index)), "sharegpt", [turn]))
        if limit is not None and len(prompts) >= limit:
            break
    return prompts


def _prompt_key(turn: str) -> str:
    """`turn` case-folded, its whitespace runs as single spaces: what makes two prompts the same one."""
    return " ".join(turn.casefold().split())


def _first_user_turns(stop: int, source="sharegpt") -> set[str]:
    """The `_prompt_key`s of the first user turns of `source`'s records before index `stop` (malformed records are
    skipped)."""
    from ..training.records import first_user_turn, iter_records

    turns = (first_user_turn(record) for _, record in iter_records(source, limit=stop))
    return {_prompt_key(turn) for turn in turns if turn is not None}


DATASETS = {"mt_bench": load_mt_bench, "humaneval": load_human_eval, "sharegpt": load_sharegpt_heldout}


def load_prompts(
    names: list[str], limit: int | None = None, num_turns: int | None = 2, offset: int = 0
) -> list[EvalPrompt]:
    """Prompts of the named datasets: per dataset, `limit` prompts after skipping its first `offset` (so that a
    tuning or probing run can use prompts a benchmark's `limit` does not)."""
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"offset={offset} and limit={limit} must be non-negative.")
    end = None if limit is None else offset + limit
    prompts = []
    for name in names:
        if name not in DATASETS:
            raise ValueError(f"Unknown dataset {name!r}; choose from {sorted(DATASETS)}.")
        if name == "mt_bench":
            prompts += load_mt_bench(end, num_turns=num_turns)[offset:]
        else:
            prompts += DATASETS[name](end)[offset:]
    return prompts
