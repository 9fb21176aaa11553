from eagle3_hf.bench_data import EvalPrompt
from eagle3_hf.commands.tune import sweep, valid_shapes

from .test_trainer import make_word_tokenizer


def test_valid_shapes_drop_trees_that_cannot_be_filled():
    shapes = valid_shapes([4, 40], [2, 3], [2])
    assert (4, 2, 2) in shapes and (4, 3, 2) in shapes
    assert (40, 2, 2) not in shapes  # 2 + 1 * 4 = 6 candidates at most


def test_sweep_measures_every_shape_fastest_first(tiny_target, tiny_draft):
    prompts = [EvalPrompt("mt_bench", "1", "writing", ["w1 w2 w3"]), EvalPrompt("mt_bench", "2", "writing", ["w9"])]
    results = sweep(tiny_target, make_word_tokenizer(), tiny_draft, prompts, [(4, 2, 2), (6, 3, 2)],
                    max_new_tokens=5, progress=False)
    assert {(r["tree_total_tokens"], r["tree_depth"], r["tree_top_k"]) for r in results} == {(4, 2, 2), (6, 3, 2)}
    speeds = [r["speedup"] for r in results]
    assert speeds == sorted(speeds, reverse=True)
    assert all((r["tau"] is None or r["tau"] >= 1.0) and r["speedup"] > 0 for r in results)
