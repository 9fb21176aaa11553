"""The committed self-distilled data (`data/regenerated/`): complete records, traceable to their ShareGPT source, and
none of the benchmark's prompts among them."""

import functools
import gzip
import json
from pathlib import Path

import pytest

from eagle3_hf.bench.prompts import SHAREGPT_HELDOUT_START, load_human_eval, load_mt_bench, load_sharegpt_heldout
from eagle3_hf.training.exclusion import normalize_words
from eagle3_hf.training.records import first_user_turn, iter_records, normalize_messages


DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "regenerated"
# each file and the dtype its records say the target computed in (`None`: written before the dtype was recorded)
FILES = {"sharegpt-turn1.jsonl.gz": {None, "float32"}, "sharegpt-turn1-bf16.jsonl.gz": {"bfloat16"}}
TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"


def normalized(text: str) -> str:
    """The words the exclusion check compares (`normalize_words`: case, spacing and punctuation do not count)."""
    return " ".join(normalize_words(text))


@functools.cache
def read_records(name: str) -> list[dict]:
    path = DATA_DIR / name
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    assert lines[-1] == "", f"{path} ends inside a record"
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture(scope="module", params=sorted(FILES))
def data_file(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def records(data_file) -> list[dict]:
    return read_records(data_file)


def test_the_files_hold_no_record_twice():
    indices = [record["index"] for name in FILES for record in read_records(name)]
    assert len(set(indices)) == len(indices)


def test_records_are_complete_first_turns_of_the_training_slice(data_file, records):
    assert len(records) > 2000
    indices = [record["index"] for record in records]
    assert len(set(indices)) == len(indices)
    assert max(indices) < SHAREGPT_HELDOUT_START  # the benchmark's held-out slice is never regenerated
    dtypes = {record.get("dtype") for record in records}
    assert dtypes <= FILES[data_file], dtypes  # each file holds its own dtype only
    for record in records:
        assert record["model"] == TARGET
        roles = [message["role"] for message in normalize_messages(record)]
        assert roles in (["user", "assistant"], ["system", "user", "assistant"])  # ShareGPT's own system turn kept
        assert len(record["finish_reasons"]) == 1 and record["finish_reasons"][0] in ("stop", "length")
        assert record["messages"][-1]["content"].strip()


def test_every_prompt_is_its_sharegpt_records_first_user_turn(records):
    by_index = {record["index"]: first_user_turn(record) for record in records}
    source = dict(iter_records("sharegpt", limit=max(by_index) + 1))
    mismatched = [index for index, turn in by_index.items() if first_user_turn(source[index]) != turn]
    assert not mismatched


def test_no_benchmark_prompt_is_in_the_training_data(records):
    """MT-bench (both turns), HumanEval and the held-out ShareGPT prompts the benchmark draws from (its first 400),
    by the exclusion check's first rule (equal words). Its second rule, a shared 13-word run, flags two records here
    (814 and 1089) that share a prompt tool's 'Ignore all previous instructions' boilerplate with held-out prompt
    OsDgu05_0: boilerplate, not a leak, so this test checks equality only."""
    evaluation = {normalized(turn) for prompt in load_mt_bench(num_turns=2) for turn in prompt.turns}
    evaluation |= {normalized(prompt.turns[0]) for prompt in load_human_eval()}
    evaluation |= {normalized(prompt.turns[0]) for prompt in load_sharegpt_heldout(400)}
    overlap = [record["index"] for record in records if normalized(first_user_turn(record)) in evaluation]
    assert not overlap, f"training records {overlap[:10]} repeat a benchmark prompt"
