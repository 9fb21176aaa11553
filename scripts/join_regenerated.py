"""Join regenerated conversation files into one training file, each conversation once.

`train` reads one `--data` file. The multi-turn file (`regenerate --max-turns 3`) answers a record's first user turn
again as the context of its later turns, so a first-turn file's record of the same source `index` can repeat it
word for word; such a record is left out (its text is already the start of the longer one). A record of the same
index whose answer differs (another dtype, another batch) is kept: it is different text for the same prompt.

    .venv/bin/python scripts/join_regenerated.py --output runs/data/all.jsonl \
        data/regenerated/sharegpt-turn1.jsonl.gz data/regenerated/sharegpt-turn1-bf16.jsonl.gz \
        data/regenerated/sharegpt-turns3-bf16.jsonl.gz

Records keep the order of the files and of the lines within them (the Trainer shuffles). The output is written
under a temporary name and renamed when complete, and a summary line says what was kept and left out.
"""

import argparse
import json
from pathlib import Path

from eagle3_hf.atomic import write_text_atomically
from eagle3_hf.training.records import iter_json_records


def join_records(records: list[dict]) -> tuple[list[dict], int]:
    """(`records` without those whose `messages` start another record of the same `index`, count left out).

    A record equal to an earlier one of the same index is left out too, so that each text appears once.
    """
    by_index: dict[object, list[list[dict]]] = {}
    for record in records:
        by_index.setdefault(record["index"], []).append(record["messages"])
    kept, left_out, seen = [], 0, set()
    for record in records:
        messages = record["messages"]
        key = json.dumps([record["index"], messages], sort_keys=True)
        longer = any(
            len(other) > len(messages) and other[: len(messages)] == messages for other in by_index[record["index"]]
        )
        if longer or key in seen:
            left_out += 1
            continue
        seen.add(key)
        kept.append(record)
    return kept, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", help="regenerated JSONL files (.gz or not), in order")
    parser.add_argument("--output", type=Path, required=True, help="the joined JSONL file")
    args = parser.parse_args()
    records = []
    for path in args.files:
        for line_number, record in enumerate(iter_json_records(path), start=1):
            if not isinstance(record, dict) or "index" not in record or "messages" not in record:
                raise ValueError(f"{path}: record {line_number} has no 'index' and 'messages' (not a regenerate file)")
            records.append(record)
    kept, left_out = join_records(records)
    write_text_atomically(args.output, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in kept))
    summary = f"{len(kept)} conversations from {len(records)} records ({left_out} repeated the start of another)"
    print(f"{args.output}: {summary}")


if __name__ == "__main__":
    main()
