import json

import pytest
import torch

from eagle3_hf.bench.prompts import EvalPrompt
from eagle3_hf.commands.tune import save_tree_settings, sweep, valid_shapes

from .test_trainer import make_word_tokenizer


def test_valid_shapes_drop_trees_that_cannot_be_filled():
    shapes = valid_shapes([4, 40], [2, 3], [2])
    assert (4, 2, 2) in shapes and (4, 3, 2) in shapes
    assert (40, 2, 2) not in shapes  # 2 + 1 * 4 = 6 candidates at most


def test_valid_shapes_count_the_root_and_need_the_depth():
    assert (7, 2, 2) in valid_shapes([7], [2], [2])  # root + 2 + 1 * 4 = TreeSettings(7, 2, 2).max_nodes
    assert valid_shapes([3, 4], [3], [2]) == [(4, 3, 2)]  # 3 nodes with the root reach depth 2 only


def test_tune_without_valid_shapes_names_the_grid():
    from eagle3_hf.commands.tune import main

    with pytest.raises(SystemExit, match=r"--total-tokens \[40\] --depth \[2\] --top-k \[2\]"):
        main(["--total-tokens", "40", "--depth", "2", "--top-k", "2"])


def test_sweep_measures_every_shape_fastest_first(tiny_target, tiny_draft):
    prompts = [EvalPrompt("mt_bench", "1", "writing", ["w1 w2 w3"]), EvalPrompt("mt_bench", "2", "writing", ["w9"])]
    shapes = [(4, 2, 2), (6, 3, 2, 0), (6, 3, 2, 3)]
    results = sweep(tiny_target, make_word_tokenizer(), tiny_draft, prompts, shapes, max_new_tokens=5, progress=False)
    measured = {(r["tree_total_tokens"], r["tree_depth"], r["tree_top_k"], r["tree_lookup_tokens"]) for r in results}
    assert measured == {(4, 2, 2, 0), (6, 3, 2, 0), (6, 3, 2, 3)}
    speeds = [r["speedup"] for r in results]
    assert speeds == sorted(speeds, reverse=True)
    assert all((r["tau"] is None or r["tau"] >= 1.0) and r["speedup"] > 0 for r in results)


def test_sweep_samples_every_prompt_once_per_seed(tiny_target, tiny_draft):
    prompts = [EvalPrompt("sharegpt", "1", "", ["w1 w2 w3"]), EvalPrompt("sharegpt", "2", "", ["w9 w4"])]
    tokenizer = make_word_tokenizer()
    results = sweep(
        tiny_target, tokenizer, tiny_draft, prompts, [(6, 3, 2)], 5, temperature=1.0, seeds=3, progress=False
    )
    assert results[0]["generations"] == 6 and results[0]["tau"] >= 1.0
    greedy = sweep(tiny_target, tokenizer, tiny_draft, prompts, [(6, 3, 2)], 5, progress=False)
    assert greedy[0]["generations"] == 2


def test_save_tree_settings_keeps_the_other_keys(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"tree_depth": 9, "my_setting": "kept"}))
    best = {"tree_total_tokens": 12, "tree_depth": 3, "tree_top_k": 8, "tree_lookup_tokens": 4, "speedup": 1.2}
    save_tree_settings(tmp_path, best)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["my_setting"] == "kept" and "speedup" not in saved
    assert {key: saved[key] for key in best if key != "speedup"} == {k: v for k, v in best.items() if k != "speedup"}
    (tmp_path / "new").mkdir()
    save_tree_settings(tmp_path / "new", best)  # no generation_config.json yet
    assert json.loads((tmp_path / "new" / "generation_config.json").read_text())["tree_lookup_tokens"] == 4


def test_sweep_drafts_in_the_requested_dtype_and_reports_it(tiny_target, tiny_draft, monkeypatch):
    from eagle3_hf.generation import decoding

    requested = []
    real = decoding.drafting_head

    def spy(draft, dtype=None, rows=8):
        requested.append(dtype)
        return real(draft, dtype, rows=rows)

    monkeypatch.setattr(decoding, "drafting_head", spy)
    prompts = [EvalPrompt("mt_bench", "1", "writing", ["w1 w2 w3"])]
    tokenizer = make_word_tokenizer()
    results = sweep(
        tiny_target, tokenizer, tiny_draft, prompts, [(4, 2, 2)], 4, progress=False, draft_dtype="bfloat16"
    )
    assert results[0]["draft_dtype"] == "bfloat16" and requested == ["bfloat16"]
    requested.clear()
    results = sweep(tiny_target, tokenizer, tiny_draft, prompts, [(4, 2, 2)], 4, progress=False)
    assert results[0]["draft_dtype"] == "float32" and requested == [None]  # auto: generate's default
    assert tiny_draft.fc.weight.dtype == torch.float32  # the caller's head keeps its dtype


def test_tune_refuses_a_wrong_draft_dtype_before_loading(capsys):
    from eagle3_hf.commands.tune import main

    with pytest.raises(SystemExit):
        main(["--draft-dtype", "int8"])
    assert "--draft-dtype=int8: expected 'auto' or a floating dtype name" in capsys.readouterr().err


def test_tune_command_writes_every_shape_and_saves_the_winner(tiny_target, tiny_draft, tmp_path, monkeypatch):
    from eagle3_hf.commands.tune import SHAPE_KEYS, main

    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / "generation_config.json").write_text(json.dumps({"tree_depth": 9, "my_setting": "kept"}))
    loaded = {}

    def load_default_pair(head=None, target=None):
        loaded.update(head=head, target=target)
        return tiny_target, make_word_tokenizer(), tiny_draft

    prompts = [EvalPrompt("mt_bench", "1", "writing", ["w1 w2 w3"]), EvalPrompt("mt_bench", "2", "writing", ["w9"])]
    monkeypatch.setattr("eagle3_hf.loading.load_default_pair", load_default_pair)
    monkeypatch.setattr("eagle3_hf.bench.prompts.load_prompts", lambda names, limit, num_turns, offset: prompts)
    output = tmp_path / "out" / "tune.json"
    argv = ["--head", str(head_dir), "--total-tokens", "4", "6", "--depth", "2", "3", "--top-k", "2"]
    argv += ["--lookup-tokens", "0", "3", "--max-new-tokens", "5", "--pack-weights", "off"]
    assert main([*argv, "--output", str(output), "--save"]) == 0

    assert loaded["head"] == str(head_dir)
    report = json.loads(output.read_text())
    measured = {tuple(row[key] for key in SHAPE_KEYS) for row in report["shapes"]}
    assert measured == {(n, d, 2, lookup) for n in (4, 6) for d in (2, 3) for lookup in (0, 3)}
    fastest = report["shapes"][0]
    assert fastest["speedup"] == max(row["speedup"] for row in report["shapes"])
    adaptive = report["adaptive_from_fastest"]  # generate's planner, started from the winner
    assert {key: adaptive[key] for key in SHAPE_KEYS} == {key: fastest[key] for key in SHAPE_KEYS}
    assert adaptive["speedup"] > 0
    saved = json.loads((head_dir / "generation_config.json").read_text())
    assert {key: saved[key] for key in SHAPE_KEYS} == {key: fastest[key] for key in SHAPE_KEYS}
    assert saved["my_setting"] == "kept"


def test_tune_refuses_negative_lookup_tokens_and_a_head_it_cannot_save_to(tmp_path, monkeypatch):
    from eagle3_hf.commands.tune import main

    def never_loaded(*args, **kwargs):
        raise AssertionError("tune loaded the models before checking its arguments")

    monkeypatch.setattr("eagle3_hf.loading.load_default_pair", never_loaded)
    with pytest.raises(SystemExit, match="--lookup-tokens must be non-negative"):
        main(["--lookup-tokens", "-1"])
    with pytest.raises(SystemExit, match="--save needs a local head folder; --head someone/eagle3-head is not one"):
        main(["--head", "someone/eagle3-head", "--save"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--top-k", "-2"], "--top-k -2: expected >= 1"),
        (["--depth", "0", "3"], "--depth 0: expected >= 1"),
        (["--limit", "0"], "--limit 0: expected >= 1"),
        (["--seeds", "0"], "--seeds 0: expected >= 1"),
        (["--temperature", "-0.5"], "--temperature -0.5: expected >= 0.0"),
    ],
)
def test_tune_refuses_impossible_grids_and_counts_before_loading(flags, message, capsys, monkeypatch):
    from eagle3_hf.commands.tune import main

    monkeypatch.setattr("eagle3_hf.loading.load_default_pair", lambda *a, **k: pytest.fail("loaded the models first"))
    with pytest.raises(SystemExit):
        main(flags)
    assert message in capsys.readouterr().err
