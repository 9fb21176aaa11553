"""Evaluation prompt sets for the benchmark: MT-bench (80 questions, 8 categories), HumanEval (164 problems) and a
held-out slice of ShareGPT that training never sees.

All three come from offline packages (see `eagle3_hf.assets`); each prompt is a list of user turns.
"""

import gzip
import json
from dataclasses import dataclass, field

from .assets import HUMAN_EVAL, MT_BENCH


# ShareGPT records with index >= this (among the complete records of the shipped file) are held out of training.
SHAREGPT_HELDOUT_START = 17000


@dataclass(frozen=True)
class EvalPrompt:
    """One benchmark prompt: `turns` are user messages, answered one after the other (multi-turn)."""

    dataset: str
    prompt_id: str
    category: str
    turns: list[str] = field(default_factory=list)


def load_mt_bench(limit: int | None = None, num_turns: int = 2) -> list[EvalPrompt]:
    """MT-bench questions in file order; `num_turns=1` keeps only the first turn."""
    prompts = []
    with open(MT_BENCH.path(), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            turns = list(row["turns"])[:num_turns]
            prompts.append(EvalPrompt("mt_bench", str(row["question_id"]), row["category"], turns))
    return prompts[:limit]


def load_human_eval(limit: int | None = None) -> list[EvalPrompt]:
    """HumanEval problems; the function signature and docstring are the single user turn, as in EAGLE's scripts."""
    prompts = []
    with gzip.open(HUMAN_EVAL.path(), "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            prompts.append(EvalPrompt("humaneval", row["task_id"], "coding", [row["prompt"]]))
    return prompts[:limit]


def load_sharegpt_heldout(limit: int | None = None, start: int = SHAREGPT_HELDOUT_START) -> list[EvalPrompt]:
    """First user turn of the held-out ShareGPT records (index >= `start`), skipping conversations without one."""
    from .data import read_sharegpt_heldout_records

    prompts = []
    for index, record in read_sharegpt_heldout_records(start):
        prompts.append(EvalPrompt("sharegpt", str(record.get("id", index)), "sharegpt", [record["first_user_turn"]]))
        if limit is not None and len(prompts) >= limit:
            break
    return prompts


DATASETS = {"mt_bench": load_mt_bench, "humaneval": load_human_eval, "sharegpt": load_sharegpt_heldout}


def load_prompts(names: list[str], limit: int | None = None, num_turns: int = 2) -> list[EvalPrompt]:
    """Prompts of the named datasets, each cut to `limit` prompts."""
    prompts = []
    for name in names:
        if name not in DATASETS:
            raise ValueError(f"Unknown dataset {name!r}; choose from {sorted(DATASETS)}.")
        if name == "mt_bench":
            prompts += load_mt_bench(limit, num_turns=num_turns)
        else:
            prompts += DATASETS[name](limit)
    return prompts
