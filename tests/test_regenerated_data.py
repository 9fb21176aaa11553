"""The committed self-distilled data (`data/regenerated/`): complete records, traceable to their ShareGPT source, and
none of the benchmark's prompts among them."""

import functools
import gzip
import json
from pathlib import Path

import pytest

from eagle3_hf.bench.prompts import SHAREGPT_HELDOUT_START, load_human_eval, load_mt_bench, load_sharegpt_heldout
from eagle3_hf.training.exclusion import normalize_words
from eagle3_hf.training.records import iter_records, normalize_messages


DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "regenerated"
GREEDY = None  # the greedy files were written before records said how they were decoded
SAMPLED = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 50}
# each file: the dtypes its records say the target computed in (`None`: written before the dtype was recorded), the
# most user turns a record holds, the decoding its records say, and a count it holds more records than (the greedy
# first-turn files hold each ShareGPT record at most once between them; the later-turn file answers again, in its
# own context, the first turns of records that have more; the sampled file answers again, in every turn that fits,
# records of the greedy files)
FILES = {
    "sharegpt-turn1.jsonl.gz": ({None, "float32"}, 1, GREEDY, 2000),
    "sharegpt-turn1-bf16.jsonl.gz": ({"bfloat16"}, 1, GREEDY, 2000),
    "sharegpt-turns3-bf16.jsonl.gz": ({"bfloat16"}, 3, GREEDY, 2000),
    "sharegpt-sampled-bf16.jsonl.gz": ({"bfloat16"}, 7, SAMPLED, 1500),
}
# Magpie data (sessions 26-32): answers file -> (the prompts file `eagle3-hf magpie` wrote, a count it holds more than)
MAGPIE_FILES = {
    "magpie-bf16.jsonl.gz": ("magpie-prompts-bf16.jsonl.gz", 11000),
    "magpie-steered-bf16.jsonl.gz": ("magpie-steered-prompts-bf16.jsonl.gz", 2900),
    "magpie-steered2-bf16.jsonl.gz": ("magpie-steered2-prompts-bf16.jsonl.gz", 3400),
}
FIRST_TURN_FILES = [
    name for name, (_, max_turns, decoding, _) in FILES.items() if max_turns == 1 and decoding is GREEDY
]
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


def user_turns(record) -> list[str]:
    return [message["content"] for message in normalize_messages(record) if message["role"] == "user"]


def test_the_first_turn_files_hold_no_record_twice():
    indices = [record["index"] for name in FIRST_TURN_FILES for record in read_records(name)]
    assert len(set(indices)) == len(indices)


def test_records_are_complete_conversations_of_the_training_slice(data_file, records):
    dtypes, max_turns, decoding, more_than = FILES[data_file]
    assert len(records) > more_than
    assert all(record.get("decoding") == decoding for record in records)
    indices = [record["index"] for record in records]
    assert len(set(indices)) == len(indices)
    assert max(indices) < SHAREGPT_HELDOUT_START  # the benchmark's held-out slice is never regenerated
    assert {record.get("dtype") for record in records} <= dtypes  # each file holds its own dtype only
    for record in records:
        assert record["model"] == TARGET
        roles = [message["role"] for message in normalize_messages(record)]
        system = roles[:1] == ["system"]  # ShareGPT's own system turn kept
        turns = len(record["finish_reasons"])
        assert 1 <= turns <= max_turns and roles == ["system"] * system + ["user", "assistant"] * turns
        assert set(record["finish_reasons"]) <= {"stop", "length"}
        assert all(message["content"].strip() for message in record["messages"] if message["role"] == "assistant")


def test_every_prompt_is_its_sharegpt_records_user_turn(records):
    """The first-turn files hold each record's first user turn; the later-turn file its first user turns in order."""
    by_index = {record["index"]: user_turns(record) for record in records}
    source = dict(iter_records("sharegpt", limit=max(by_index) + 1))
    mismatched = [index for index, turns in by_index.items() if user_turns(source[index])[: len(turns)] != turns]
    assert not mismatched


@functools.cache
def evaluation_prompts() -> frozenset[str]:
    """MT-bench's prompts (both turns), HumanEval's and the held-out ShareGPT prompts the benchmark draws from (its
    first 400), normalised."""
    evaluation = {normalized(turn) for prompt in load_mt_bench(num_turns=2) for turn in prompt.turns}
    evaluation |= {normalized(prompt.turns[0]) for prompt in load_human_eval()}
    evaluation |= {normalized(prompt.turns[0]) for prompt in load_sharegpt_heldout(400)}
    return frozenset(evaluation)


def benchmark_overlap(records) -> list[int]:
    """The indices of records with a user turn equal to an evaluation prompt (the exclusion check's first rule)."""
    evaluation = evaluation_prompts()
    return [
        record["index"] for record in records if any(normalized(turn) in evaluation for turn in user_turns(record))
    ]


def test_no_benchmark_prompt_is_in_the_training_data(records):
    """No user turn of a record is a benchmark prompt, by the exclusion check's first rule (equal words). Its second
    rule, a shared 13-word run, flags two records here (814 and 1089) that share a prompt tool's 'Ignore all previous
    instructions' boilerplate with held-out prompt OsDgu05_0: boilerplate, not a leak, so this test checks equality
    only."""
    overlap = benchmark_overlap(records)
    assert not overlap, f"training records {overlap[:10]} repeat a benchmark prompt"


@pytest.mark.parametrize("answers_file", sorted(MAGPIE_FILES))
def test_magpie_answers_answer_the_prompts_the_target_wrote(answers_file):
    """Each record answers, greedily in bfloat16, the prompt of the same index in the file `eagle3-hf magpie` wrote
    (which filtered out the evaluation prompts; checked again here), once, with a non-empty answer."""
    prompts_file, more_than = MAGPIE_FILES[answers_file]
    prompts = {record["index"]: record for record in read_records(prompts_file)}
    assert all(record["source"] == "magpie" and record["model"] == TARGET for record in prompts.values())
    for record in prompts.values():
        if "prompt_start" in record:  # steered (`--prompt-starts`): the prompt opens with the words it was given
            assert record["prompt_start"] in record["prompt_starts"]
            assert user_turns(record)[0].startswith(record["prompt_start"])
    answers = read_records(answers_file)
    indices = [record["index"] for record in answers]
    assert len(answers) > more_than and len(set(indices)) == len(indices) and set(indices) <= set(prompts)
    for record in answers:
        assert record["model"] == TARGET and record["dtype"] == "bfloat16"
        assert record["decoding"] == {"do_sample": False} and record["finish_reasons"] in (["stop"], ["length"])
        assert record["id"] == prompts[record["index"]]["id"]
        assert user_turns(record) == user_turns(prompts[record["index"]])
        roles = [message["role"] for message in record["messages"]]
        assert roles == ["user", "assistant"] and record["messages"][1]["content"].strip()
    assert not benchmark_overlap(answers)
