"""scripts/join_regenerated.py: each regenerated text once, the longer conversation kept, the output complete."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

from .conftest import load_script


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "join_regenerated.py"
join_regenerated = load_script("join_regenerated")


def _turns(*texts: str) -> list[dict]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]


FIRST_TURN = _turns("hi", "hello")
LATER_TURNS = _turns("hi", "hello", "and then?", "then this")
OTHER_ANSWER = _turns("hi", "hello there")  # the same prompt answered differently (another dtype or batch)


def test_a_first_turn_repeated_by_a_longer_conversation_is_left_out():
    records = [
        {"index": 3, "messages": FIRST_TURN},
        {"index": 3, "messages": OTHER_ANSWER},
        {"index": 4, "messages": FIRST_TURN},  # another source record: not a repeat
        {"index": 3, "messages": LATER_TURNS},
    ]
    kept, left_out = join_regenerated.join_records(records)
    assert [(r["index"], r["messages"]) for r in kept] == [(3, OTHER_ANSWER), (4, FIRST_TURN), (3, LATER_TURNS)]
    assert left_out == 1


def test_an_exact_duplicate_is_kept_once():
    kept, left_out = join_regenerated.join_records([{"index": 1, "messages": FIRST_TURN}] * 2)
    assert kept == [{"index": 1, "messages": FIRST_TURN}] and left_out == 1


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_the_script_joins_gzip_and_plain_files(tmp_path):
    first = tmp_path / "turn1.jsonl.gz"
    with gzip.open(first, "wt") as file:
        file.write(json.dumps({"index": 3, "messages": FIRST_TURN, "dtype": "bfloat16"}) + "\n")
        file.write(json.dumps({"index": 5, "messages": FIRST_TURN, "dtype": "bfloat16"}) + "\n")
    later = tmp_path / "turns3.jsonl"
    later.write_text(json.dumps({"index": 3, "messages": LATER_TURNS, "dtype": "bfloat16"}) + "\n")
    output = tmp_path / "all.jsonl"
    result = _run("--output", str(output), str(first), str(later))
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["index"] for line in output.read_text().splitlines()] == [5, 3]
    assert "2 conversations from 3 records (1 repeated" in result.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["all.jsonl", "turn1.jsonl.gz", "turns3.jsonl"]


def test_a_file_that_is_not_regenerated_data_is_refused_by_name(tmp_path):
    bad = tmp_path / "sharegpt.jsonl"
    bad.write_text(json.dumps({"id": "x", "conversations": []}) + "\n")
    output = tmp_path / "all.jsonl"
    result = _run("--output", str(output), str(bad))
    assert result.returncode != 0
    assert f"{bad}: record 1 has no 'index' and 'messages'" in result.stderr
    assert not output.exists()
