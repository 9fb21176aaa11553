"""scripts/mix_regenerated.py: whole parts (repeated), a random fill up to a total, one seeded shuffle, checked lines."""

import gzip
import json
import random

import pytest

from .conftest import load_script


mix_regenerated = load_script("mix_regenerated")


def _write(path, names, gz=False):
    text = "".join(
        json.dumps({"index": i, "messages": [{"role": "user", "content": n}]}) + "\n" for i, n in enumerate(names)
    )
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as file:
            file.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _contents(path):
    return [json.loads(line)["messages"][0]["content"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_parts_are_taken_whole_and_repeated_and_the_fill_tops_up_to_the_total(tmp_path):
    sampled = _write(tmp_path / "sampled.jsonl.gz", ["s0", "s1", "s2"], gz=True)
    greedy = _write(tmp_path / "greedy.jsonl", [f"g{i}" for i in range(20)])
    output = tmp_path / "mix.jsonl"
    mix_regenerated.main(
        [f"{sampled}*2", "--fill", str(greedy), "--total", "10", "--seed", "3", "--output", str(output)]
    )
    contents = _contents(output)
    assert sorted(c for c in contents if c.startswith("s")) == ["s0", "s0", "s1", "s1", "s2", "s2"]
    drawn = [c for c in contents if c.startswith("g")]
    assert len(drawn) == 4 and len(set(drawn)) == 4  # drawn without replacement
    # the stages' recipe, written out: the parts end to end, the draw, then the shuffle, all from one generator
    rng = random.Random(3)
    expected = ["s0", "s1", "s2"] * 2
    expected += rng.sample([f"g{i}" for i in range(20)], 4)
    rng.shuffle(expected)
    assert contents == expected


def test_without_a_fill_every_part_is_shuffled_together_and_the_output_repeats_with_the_seed(tmp_path):
    a = _write(tmp_path / "a.jsonl", ["a0", "a1", "a2", "a3"])
    b = _write(tmp_path / "b.jsonl", ["b0"])
    first, second, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    for output, seed in ((first, "0"), (second, "0"), (other, "1")):
        mix_regenerated.main([str(a), f"{b}*3", "--seed", seed, "--output", str(output)])
    assert sorted(_contents(first)) == ["a0", "a1", "a2", "a3", "b0", "b0", "b0"]
    assert first.read_bytes() == second.read_bytes()
    assert _contents(other) != _contents(first)


def test_a_total_the_files_cannot_make_is_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", ["a0", "a1"])
    fill = _write(tmp_path / "fill.jsonl", ["f0"])
    output = tmp_path / "mix.jsonl"
    with pytest.raises(ValueError, match=r"--total 5: the parts hold 2 lines and --fill 1 more.*\[2, 3\]"):
        mix_regenerated.main([str(a), "--fill", str(fill), "--total", "5", "--output", str(output)])
    with pytest.raises(ValueError, match="--total 1 without --fill: the parts hold 2 lines"):
        mix_regenerated.main([str(a), "--total", "1", "--output", str(output)])
    with pytest.raises(ValueError, match="--fill needs --total"):
        mix_regenerated.main([str(a), "--fill", str(fill), "--output", str(output)])
    with pytest.raises(ValueError, match="repeat count must be at least 1"):
        mix_regenerated.main([f"{a}*0", "--output", str(output)])
    assert not output.exists()


def test_a_partial_last_line_or_a_record_without_messages_names_the_file_and_line(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"index": 0, "messages": []}\n{"index": 1, "mess', encoding="utf-8")
    other = tmp_path / "other.jsonl"
    other.write_text('{"index": 0, "messages": []}\n{"index": 1, "conversations": []}\n', encoding="utf-8")
    output = tmp_path / "mix.jsonl"
    with pytest.raises(ValueError, match=r"cut\.jsonl:2 has no newline: the partial line of an interrupted run"):
        mix_regenerated.main([str(cut), "--output", str(output)])
    with pytest.raises(ValueError, match=r"other\.jsonl:2 is not a regenerated conversation"):
        mix_regenerated.main([str(other), "--output", str(output)])
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        mix_regenerated.main([str(tmp_path / "missing.jsonl"), "--output", str(output)])
    assert not output.exists()
