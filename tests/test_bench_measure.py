import json

import pytest
import torch

from eagle3_hf.bench.measure import (
    GenerationRecord,
    acceptance_by_position,
    deepest_draft_positions,
    record_rounds,
    round_draft_limits,
    speedup_interval,
    summarize,
    timed_generate,
    tokens_per_round,
)
from eagle3_hf.bench.report import markdown_table, write_report


def test_tokens_per_round_from_cache_lengths():
    # prefill at 0; prompt of 5; rounds commit 3, 1, 2 tokens; final sequence 5 + 1 + 3 + 1 + 2 = 12
    assert tokens_per_round([0, 5, 8, 9], 12) == [3, 1, 2]
    assert tokens_per_round([0], 6) == []


def test_prompt_lookup_rounds_keep_the_tokens_of_its_first_forward(tiny_target):
    # prompt lookup drafts in its first forward: 46 - 36 + 1 = 11 tokens, the prefill's 1 and a round of 10
    assert tokens_per_round([0, 46, 57], 60, prompt_length=36) == [10, 11, 2]
    assert tokens_per_round([0, 36, 40], 43, prompt_length=36) == [4, 2]  # a plain prefill: 1 token
    assert tokens_per_round([0], 40, prompt_length=36) == [3]
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]])
    for method in ("prompt_lookup", "plain"):
        measured = timed_generate(tiny_target, ids, method, 0.0, 12)
        assert sum(measured.tokens_per_round) == len(measured.new_ids) - 1


def test_plain_generate_has_one_token_per_round(tiny_target):
    ids = torch.tensor([[1, 2, 3]])
    new_ids, seconds, rounds, shapes, confidences, threads = timed_generate(tiny_target, ids, "plain", 0.0, 6)
    assert len(new_ids) == 6 and seconds > 0
    assert rounds == [1] * 5  # the first new token: the prefill's
    assert shapes is None and confidences is None and threads is None


def test_record_rounds_removes_its_hook(tiny_target):
    with record_rounds(tiny_target) as lengths:
        tiny_target(torch.tensor([[1, 2]]))
    tiny_target(torch.tensor([[1, 2]]))
    assert lengths == [0]


def test_acceptance_by_position():
    # accepted = 0, 1, 2, 2 -> position 1: 3/4 accepted; position 2: 2/3; position 3: 0/2
    assert acceptance_by_position([1, 2, 3, 3]) == pytest.approx([0.75, 2 / 3, 0.0])


def _record(method, tokens, seconds, rounds, category="writing", dataset="mt_bench", match=True, temperature=0.0):
    return GenerationRecord(dataset, "1", category, 0, method, temperature, 10, tokens, seconds, rounds, match)


def test_acceptance_ends_at_the_deepest_draft_and_skips_positions_cut_by_max_new_tokens():
    from eagle3_hf.generation.decoding import TreeSettings

    tree = TreeSettings(total_tokens=8, depth=3, top_k=4, lookup_tokens=4)
    # perfect drafts, max_new_tokens 30: 1 (prefill) + 7 * 4 = 29, the last round could draft nothing
    records = [_record(m, 30, 1.0, [4] * 7 + [1]) for m in ("plain", "tree", "tree_lookup")]
    records.append(_record("chain", 20, 1.0, [6, 6, 6, 1]))  # 1 + 18: one token left, nothing drafted
    records.append(_record("prompt_lookup", 30, 1.0, [11, 11, 7]))  # 1 + 22, then 6 drafted of 7 left
    rows = {r["method"]: r for r in summarize(records, max_new_tokens=30, tree=tree)["rows"]}
    assert rows["tree"]["acceptance_by_position"] == [1.0, 1.0, 1.0]
    assert rows["tree"]["tau"] == pytest.approx(29 / 8)  # tau keeps the reference's definition
    assert rows["tree_lookup"]["acceptance_by_position"] == [1.0, 1.0, 1.0, 0.0]  # the chain reaches 4
    assert rows["prompt_lookup"]["acceptance_by_position"] == [1.0] * 10
    records = [_record("chain", 20, 1.0, [6, 6, 6, 1])]
    assert summarize(records, max_new_tokens=20, tree=tree)["rows"][0]["acceptance_by_position"] == [1.0] * 5
    sampled = {"tree_lookup": 3, "tree": 3, "chain": 5, "prompt_lookup": 10}
    assert deepest_draft_positions(tree, sampled=True) == sampled  # a sampled tree's chain: (8 - 1) // 2 nodes
    # round limits: 1 token at the prefill, then what each round committed
    assert round_draft_limits(_record("tree", 10, 1.0, [4, 4, 1]), 10) == [8, 4, 0]


def test_greedy_mismatches_are_unknown_where_no_output_is_compared():
    records = [
        _record(m, 10, 1.0, [1] * 9, dataset="humaneval", match=None, temperature=1.0) for m in ("plain", "tree")
    ]
    rows = summarize(records)["rows"]
    assert [r["greedy_mismatches"] for r in rows] == [None, None]
    assert "| humaneval | 1 | tree | 1.00 | 10.0 | 1.00x | - | - | - | 1 |" in markdown_table({"rows": rows})


def _prompt_record(method, prompt_id, tokens, seconds):
    return GenerationRecord("sharegpt", prompt_id, "", 0, method, 1.0, 10, tokens, seconds, [1] * (tokens - 1))


def test_speedup_interval_pairs_each_prompt_with_its_plain_run():
    # prompts of very different lengths, every one exactly twice as fast: the paired interval is the point itself
    lengths = [10, 40, 90, 160, 250]
    plain = [_prompt_record("plain", str(i), n, n / 10) for i, n in enumerate(lengths)]
    tree = [_prompt_record("tree", str(i), n, n / 20) for i, n in enumerate(lengths)]
    assert speedup_interval(tree, plain) == pytest.approx((2.0, 2.0))
    # per-prompt speedups 0.9x to 1.1x: the interval holds the pooled speedup and stays inside what was seen
    noisy = [_prompt_record("tree", str(i), n, n / 10 / f) for i, (n, f) in enumerate(zip(lengths, (0.9, 1.1) * 3))]
    low, high = speedup_interval(noisy, plain)
    rows = {r["method"]: r for r in summarize(plain + noisy)["rows"]}
    assert 0.9 <= low < rows["tree"]["speedup"] < high <= 1.1
    assert rows["tree"]["speedup_interval"] == [low, high] and rows["plain"]["speedup_interval"] is None
    assert f"({low:.2f}-{high:.2f})" in markdown_table(summarize(plain + noisy))
    assert speedup_interval(tree[:2], plain[:2]) is None  # too few prompts to say anything


def test_bench_command_records_the_arguments_of_both_entry_points(monkeypatch):
    from eagle3_hf.commands.bench import bench_command

    monkeypatch.setattr("sys.argv", ["/x/eagle3_hf/commands/bench.py", "--limit", "8", "--temperatures", "0"])
    assert bench_command(None) == "eagle3-hf bench --limit 8 --temperatures 0"  # python -m eagle3_hf.commands.bench
    assert bench_command(["--limit", "8"]) == "eagle3-hf bench --limit 8"  # eagle3-hf bench (cli passes argv)


def test_greedy_mismatches_fail_a_float32_bench_and_are_reported_in_low_precision(capsys):
    from eagle3_hf.commands.bench import report_greedy_mismatches

    records = [_record("plain", 10, 2.0, [1] * 9), _record("tree", 10, 1.0, [3, 3, 3], match=False)]
    summary = summarize(records)  # one mismatch on mt_bench, counted once (not again in its category row)
    assert report_greedy_mismatches(summary, torch.float32) == 1
    assert "ERROR: 1 greedy outputs differ from plain generate" in capsys.readouterr().err
    assert report_greedy_mismatches(summary, torch.float64) == 1  # wider than float32: bit-identical too
    assert "ERROR" in capsys.readouterr().err
    assert report_greedy_mismatches(summary, torch.bfloat16) == 0
    assert (
        "WARNING: 1 greedy outputs differ from plain generate with the target in bfloat16;" in capsys.readouterr().err
    )
    matching = summarize([_record("plain", 10, 2.0, [1] * 9), _record("tree", 10, 1.0, [3, 3, 3])])
    assert report_greedy_mismatches(matching, torch.float32) == 0 and not capsys.readouterr().err


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
    assert "| mt_bench | 0 | tree | 3.00 | 10.0 | 2.00x | - | - | 1 | 2 |" in text
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
    from eagle3_hf.bench.measure import run_benchmark
    from eagle3_hf.bench.prompts import EvalPrompt

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
    assert len(records) == 3 * 2 * 6  # turns x temperatures x methods
    greedy = [r for r in records if r.temperature == 0]
    assert all(r.matches_plain for r in greedy)  # lossless: every method reproduces plain greedy
    # the prefill emits the first token; every later token is counted in exactly one round
    assert all(0 < r.new_tokens <= 6 and sum(r.tokens_per_round) == r.new_tokens - 1 for r in records)
    rows = summarize(records)["rows"]
    assert {r["method"] for r in rows} == {"plain", "prompt_lookup", "chain", "tree", "tree_lookup", "adaptive"}
    assert all(r["fewer_threads_share"] in (None, 0.0) for r in rows)
    assert any(r["dataset"] == "mt_bench/writing" for r in rows)
    for record in records:  # the head's rounds record their shapes, one per round; other methods have none
        if record.method in ("tree", "tree_lookup", "adaptive"):
            assert len(record.round_shapes) == len(record.tokens_per_round) == len(record.round_confidences)
            # the tests run on one thread: nothing to adapt, every round on the caller's count
            assert record.threads == 1 and record.round_threads == [1] * len(record.round_shapes)
            drafted = [c for (_, depth), c in zip(record.round_shapes, record.round_confidences) if depth > 0]
            assert all(0 < confidence <= 1 for confidence in drafted)  # every tree records what it was drafted from
        if record.method in ("tree", "tree_lookup"):  # a fixed shape drafts in every round but a last 1-token one
            assert all(depth > 0 for _, depth in record.round_shapes[:-1])
        if record.method in ("plain", "prompt_lookup"):
            assert record.round_shapes is None


def test_the_share_of_tree_rounds_counts_the_adaptive_defaults_plain_steps():
    adaptive = _record("adaptive", 10, 1.0, [3, 1, 1, 3])
    adaptive.round_shapes = [(8, 3), (1, 0), (1, 0), (6, 2)]
    adaptive.round_threads, adaptive.threads = [2, 1, 2, 2], 2  # one round on fewer threads than the caller's
    summary = summarize([_record("plain", 10, 2.0, [1] * 9), adaptive])
    rows = {r["method"]: r for r in summary["rows"] if r["dataset"] == "mt_bench"}
    assert rows["adaptive"]["tree_round_share"] == 0.5 and rows["plain"]["tree_round_share"] is None
    assert rows["adaptive"]["fewer_threads_share"] == 0.25 and rows["plain"]["fewer_threads_share"] is None
    assert "| mt_bench | 0 | adaptive | 2.00 | 10.0 | 2.00x | 50% | 25% | 0 | 1 |" in markdown_table(summary)


def test_tree_methods_with_and_without_prompt_lookup_branches():
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from eagle3_hf.bench.measure import TREE_LOOKUP_TOKENS, method_kwargs

    draft = SimpleNamespace(generation_config=GenerationConfig())  # a head whose config sets no lookup
    shape = {"tree_total_tokens": 8}
    assert method_kwargs("tree", draft, {**shape, "tree_lookup_tokens": 3}) == {
        "assistant_model": draft,
        "tree_total_tokens": 8,
        "tree_lookup_tokens": 0,  # the tree alone, even when the head's config or the caller asks for lookup
        "tree_adaptive": False,  # that shape in every round
    }
    # generate's default path, starting from the shape asked for
    assert method_kwargs("adaptive", draft, shape) == {"assistant_model": draft, **shape, "tree_adaptive": True}
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


def test_bench_command_rejects_a_wrong_draft_dtype_and_passes_a_right_one_to_generate(capsys):
    from eagle3_hf.commands.bench import main, make_parser, tree_kwargs_from_args

    with pytest.raises(SystemExit):  # before loading any model
        main(["--draft-dtype", "int8"])
    assert "--draft-dtype=int8: expected 'auto' or a floating dtype name" in capsys.readouterr().err
    assert (
        tree_kwargs_from_args(make_parser().parse_args(["--draft-dtype", "float32"]))["tree_draft_dtype"] == "float32"
    )
    assert "tree_draft_dtype" not in tree_kwargs_from_args(make_parser().parse_args([]))  # auto: generate's default


@pytest.mark.parametrize(
    "methods, target_rows, draft_rows",
    [
        (["plain", "tree"], [12], [2, 3, 4, 5, 8]),  # 12 nodes; frontier 8; accepted paths of 1 to depth + 1 tokens
        (["plain", "chain"], [12, 6], [2, 3, 4, 5, 8]),  # + chain mode's 5 drafted tokens and its bonus
        (["plain", "prompt_lookup"], [12, *range(2, 12)], [2, 3, 4, 5, 8]),  # + every prompt-lookup length
        (["plain", "tree_lookup"], [12], [2, 3, 4, 5, 8, 2, 3, 4, 5, 6, 7]),  # + paths as long as the chain
        (["plain", "adaptive"], [12], [2, 3, 4, 5, 8, 2, 3, 4, 5, 6, 7]),  # + trees two levels deeper
    ],
)
def test_bench_packs_the_rows_every_benchmarked_method_verifies(methods, target_rows, draft_rows, monkeypatch):
    from eagle3_hf.commands.bench import make_parser, pack_for_methods
    from eagle3_hf.generation.decoding import TreeSettings

    calls = []
    monkeypatch.setattr(
        "eagle3_hf.generation.cpu_packing.pack_for_decoding",
        lambda target, draft, target_rows, draft_rows, mode: calls.append((target_rows, draft_rows, mode)) or "packed",
    )
    args = make_parser().parse_args(["--methods", *methods, "--pack-weights", "on"])
    assert pack_for_methods("target", "draft", args, TreeSettings(12, 4, 8, lookup_tokens=6)) == "packed"
    assert calls == [(target_rows, draft_rows, "on")]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--limit", "0"], "--limit 0: expected >= 1"),
        (["--offset", "-1"], "--offset -1: expected >= 0"),
        (["--turns", "3"], "--turns 3: expected 1 or 2"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0: expected >= 1"),
        (["--temperatures", "0", "-1"], "--temperatures -1.0: expected >= 0.0"),
    ],
)
def test_bench_command_refuses_impossible_counts_before_loading(flags, message, capsys, monkeypatch):
    from eagle3_hf.commands.bench import main

    monkeypatch.setattr("eagle3_hf.loading.load_default_pair", lambda *a, **k: pytest.fail("loaded the models first"))
    with pytest.raises(SystemExit):
        main(flags)
    assert message in capsys.readouterr().err
