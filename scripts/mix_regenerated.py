"""Mix regenerated conversation files into one shuffled training file: some whole (each maybe repeated), the rest
drawn at random from a larger file up to a total.

The decay stages of issue 17 train on such mixes: stage 9 every sampled conversation plus greedy ones drawn at
random up to 2,824; stage 10 every sampled conversation twice, topped up with greedy ones to 9,600; stage 11 every
greedy conversation plus every sampled one twice:

    .venv/bin/python scripts/mix_regenerated.py --output runs/stage10/mix.jsonl \
        runs/regen/sharegpt-sampled-bf16.jsonl*2 --fill runs/data/all.jsonl --total 9600 --seed 0
    .venv/bin/python scripts/mix_regenerated.py --output runs/stage11/mix.jsonl \
        runs/data/all.jsonl runs/regen/sharegpt-sampled-bf16.jsonl*2 --seed 0

A part is `FILE` or `FILE*N` (every line N times); parts are laid end to end in the order given, the `--fill`
lines drawn without replacement are appended, and the whole is shuffled, all with one `random.Random(seed)`, so a
mix is reproduced line for line from its files and seed. Lines are copied as they are (`.gz` files are read too).
Every line must be a complete JSON object with `messages` (a `regenerate` record): a file whose last line has no
newline was left by an interrupted run and is refused (rerunning `regenerate` on it cuts that line off). The output
is written under a temporary name and renamed when complete.
"""

import argparse
import gzip
import json
import random
import re
from pathlib import Path

from eagle3_hf.atomic import write_text_atomically


PART = re.compile(r"(?P<path>.+?)(?:\*(?P<times>\d+))?")


def read_lines(path: Path) -> list[str]:
    """The lines of a regenerated JSONL file, each checked to be a complete record with `messages`."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            if not raw.endswith(b"\n"):
                raise ValueError(f"{path}:{number} has no newline: the partial line of an interrupted run.")
            if not raw.strip():
                continue
            line = raw.decode("utf-8")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number} is not JSON: {error}") from error
            if not isinstance(record, dict) or "messages" not in record:
                raise ValueError(f"{path}:{number} is not a regenerated conversation (a JSON object with 'messages').")
            lines.append(line)
    return lines


def parse_part(spec: str) -> tuple[Path, int]:
    """`FILE` or `FILE*N` as (path, N >= 1)."""
    match = PART.fullmatch(spec)
    times = int(match["times"]) if match["times"] is not None else 1
    if times < 1:
        raise ValueError(f"part {spec!r}: the repeat count must be at least 1.")
    return Path(match["path"]), times


def mix_lines(parts: list[tuple[list[str], int]], fill: list[str] | None, total: int | None, seed: int) -> list[str]:
    """Every part's lines `times` times, end to end, then `total - len(those)` lines drawn from `fill`, shuffled.

    With `fill` given, `total` must lie between the parts' line count and that plus `len(fill)`.
    """
    rng = random.Random(seed)
    mix = [line for lines, times in parts for line in lines * times]
    if fill is not None:
        if total is None:
            raise ValueError("--fill needs --total (how many lines the mix should have).")
        if not len(mix) <= total <= len(mix) + len(fill):
            raise ValueError(
                f"--total {total}: the parts hold {len(mix)} lines and --fill {len(fill)} more, so the total must lie "
                f"in [{len(mix)}, {len(mix) + len(fill)}]."
            )
        mix += rng.sample(fill, total - len(mix))
    elif total is not None and total != len(mix):
        raise ValueError(f"--total {total} without --fill: the parts hold {len(mix)} lines.")
    rng.shuffle(mix)
    return mix


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help="FILE or FILE*N: regenerated JSONL files (.gz or not) taken whole")
    parser.add_argument("--fill", type=Path, help="a file to draw lines from at random, without replacement")
    parser.add_argument("--total", type=int, help="the mix's line count, reached with --fill")
    parser.add_argument("--seed", type=int, default=0, help="the one random.Random seed of the draw and the shuffle")
    parser.add_argument("--output", type=Path, required=True, help="the mixed JSONL file")
    args = parser.parse_args(argv)
    if not args.parts and args.fill is None:
        parser.error("nothing to mix: give parts, --fill or both.")
    parts = []
    for spec in args.parts:
        path, times = parse_part(spec)
        parts.append((read_lines(path), times))
    fill = read_lines(args.fill) if args.fill is not None else None
    mix = mix_lines(parts, fill, args.total, args.seed)
    write_text_atomically(args.output, "".join(mix))
    counts = ", ".join(f"{len(lines)} x {times}" for lines, times in parts)
    drawn = f" + {len(mix) - sum(len(lines) * times for lines, times in parts)} drawn from {args.fill}" if fill else ""
    print(f"{len(mix)} conversations ({counts or 'no parts'}{drawn}) written to {args.output}")


if __name__ == "__main__":
    main()
