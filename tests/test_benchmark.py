import json

import pytest
import torch

from eagle3_hf.bench_report import markdown_table, write_report
from eagle3_hf.benchmark import (
    GenerationRecord,
    acceptance_by_position,
    record_rounds,
    summarize,
    timed_generate,
    tokens_per_round,
)


def test_tokens_per_round_from_cache_lengths():
    # prefill at 0; prompt of 5; rounds commit 3, 1, 2 tokens; final sequence 5 + 1 + 3 + 1 + 2 = 12
    assert tokens_per_round([0, 5, 8, 9], 12) == [3, 1, 2]
    assert tokens_per_round([0], 6) == []


def test_plain_generate_has_one_token_per_round(tiny_target):
    ids = torch.tensor([[1, 2, 3]])
    new_ids, seconds, rounds = timed_generate(tiny_target, ids, "plain", 0.0, 6)
    assert len(new_ids) == 6 and seconds > 0
    assert rounds == [1] * 5  # the first new token comes from the prefill


def test_record_rounds_removes_its_hook(tiny_target):
    with record_rounds(tiny_target) as lengths:
        tiny_target(torch.tensor([[1, 2]]))
    tiny_target(torch.tensor([[1, 2]]))
    assert lengths == [0]


def test_acceptance_by_position():
    # accepted = 0, 1, 2, 2 -> position 1: 3/4 accepted; position 2: 2/3; position 3: 0/2
    assert acceptance_by_position([1, 2, 3, 3]) == pytest.approx([0.75, 2 / 3, 0.0])


def _record(method, tokens, seconds, rounds, category="writing", dataset="mt_bench", match=True):
    return GenerationRecord(dataset, "1", category, 0, method, 0.0, 10, tokens, seconds, rounds, match)


def test_summary_speedup_tau_and_categories(tmp_path):
    records = [
        _record("plain", 10, 2.0, [1] * 9),
        _record("tree", 10, 1.0, [3, 3, 3]),
        _record("tree", 10, 1.0, [3, 3, 3], match=False),
        _record("plain", 10, 2.0, [1] * 9),
    ]
    rows = {(r["dataset"], r["method"]): r for r in summarize(records)["rows"]}
    assert rows[("mt_bench", "tree")]["speedup"] == pytest.approx(2.0)
    assert rows[("mt_bench", "tree")]["tau"] == pytest.approx(3.0)
    assert rows[("mt_bench", "tree")]["greedy_mismatches"] == 1
    assert ("mt_bench/writing", "tree") in rows
    summary = summarize(records)
    text = markdown_table(summary, "test machine", "eagle3-hf bench")
    assert "| mt_bench | 0 | tree | 3.00 | 10.0 | 2.00x | 1 | 2 |" in text
    paths = write_report(summary, tmp_path, "m", "c")
    assert {p.name for p in paths} == {
        "results.json",
        "results.md",
        "speedup.png",
        "tau.png",
        "acceptance_by_position.png",
    }
    assert json.loads((tmp_path / "results.json").read_text())["rows"]


def test_run_benchmark_on_tiny_models_checks_every_method(tiny_target, tiny_draft):
    from eagle3_hf.bench_data import EvalPrompt
    from eagle3_hf.benchmark import run_benchmark

    from .test_trainer import make_word_tokenizer

    prompts = [
        EvalPrompt("mt_bench", "1", "writing", ["w1 w2 w3", "w4 w5"]),
        EvalPrompt("humaneval", "2", "coding", ["w7 w8"]),
    ]
    records = run_benchmark(
        tiny_target,
        make_word_tokenizer(),
        tiny_draft,
        prompts,
        temperatures=(0.0, 1.0),
        max_new_tokens=6,
        warmup=1,
        progress=False,
    )
    assert len(records) == 3 * 2 * 5  # turns x temperatures x methods
    greedy = [r for r in records if r.temperature == 0]
    assert all(r.matches_plain for r in greedy)  # lossless: every method reproduces plain greedy
    # the prefill emits the first token; every later token is counted in exactly one round
    assert all(0 < r.new_tokens <= 6 and sum(r.tokens_per_round) == r.new_tokens - 1 for r in records)
    rows = summarize(records)["rows"]
    assert {r["method"] for r in rows} == {"plain", "prompt_lookup", "chain", "tree", "tree_lookup"}
    assert any(r["dataset"] == "mt_bench/writing" for r in rows)


def test_tree_methods_with_and_without_prompt_lookup_branches():
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from eagle3_hf.benchmark import TREE_LOOKUP_TOKENS, method_kwargs

    draft = SimpleNamespace(generation_config=GenerationConfig())  # a head whose config sets no lookup
    shape = {"tree_total_tokens": 8}
    assert method_kwargs("tree", draft, {**shape, "tree_lookup_tokens": 3}) == {
        "assistant_model": draft,
        "tree_total_tokens": 8,
        "tree_lookup_tokens": 0,  # the tree alone, even when the head's config or the caller asks for lookup
    }
    assert method_kwargs("tree_lookup", draft, shape)["tree_lookup_tokens"] == TREE_LOOKUP_TOKENS
    assert method_kwargs("tree_lookup", draft, {"tree_lookup_tokens": 2})["tree_lookup_tokens"] == 2
    tuned = SimpleNamespace(generation_config=GenerationConfig(tree_lookup_tokens=6))  # what `tune --save` writes
    assert method_kwargs("tree_lookup", tuned, shape)["tree_lookup_tokens"] == 6
    assert method_kwargs("tree_lookup", tuned, {"tree_lookup_tokens": 3})["tree_lookup_tokens"] == 3
    with pytest.raises(ValueError, match="tree_lookup_tokens=0: the tree_lookup method needs a positive int"):
        method_kwargs("tree_lookup", tuned, {"tree_lookup_tokens": 0})
    with pytest.raises(ValueError, match="Unknown method"):
        method_kwargs("medusa", draft, shape)


def test_bench_command_rejects_tree_lookup_without_lookup_tokens(capsys):
    from eagle3_hf.commands.bench import main

    with pytest.raises(SystemExit):  # before loading any model
        main(["--tree-lookup-tokens", "0"])
    assert "--tree-lookup-tokens 0: expected >= 1" in capsys.readouterr().err
