"""The scaling claim on our target: held-out accuracy and simulated acceptance against training data (issue 17).

Scores every saved checkpoint of one or more training runs with `eagle3-hf diagnose` (one JSON report per
checkpoint, kept and reused: a rerun scores only new checkpoints), then plots held-out top-1 accuracy at
training-time-test steps 0-2 and the simulated acceptance length against the conversations each checkpoint had
seen, on a log scale, one line style per run, and prints the table.

The runs are meant to be one pass over the data at a constant learning rate (`--lr_scheduler_type
constant_with_warmup --num_train_epochs 1`), so that the checkpoint after `n` conversations is the head that `n`
conversations make with this recipe. A head trained otherwise (the same pass ending on a decayed rate, say) can be
added as a single marker with `--point "LABEL=CONVERSATIONS:REPORT.json"`.

    python scripts/plot_scaling.py --run "TTT, 3 steps=runs/scaling/ttt3" --run "no TTT (1 step)=runs/scaling/ttt1" \
        --steps 75 150 300 600 1200 --conversations-per-step 4 --reference "shipped head=runs/scaling/shipped.json" \
        --point "TTT, decayed end=4828:runs/scaling/ttt3-decay/diagnose-1207.json" \
        --output model_cards/eagle3-SmolLM2-135M-Instruct/scaling/scaling.png -- --data data/regenerated/sharegpt-turn1.jsonl.gz --data_offset 800 \
        --data_limit 4 --heldout_limit 60 --max_length 512 --threads 2 --regenerated_dir runs/diagnose/answers

A run may also be given by its reports alone, `--run "LABEL=DIR/name-{step}.json"` (a path with `{step}`): every
file matching it is read as the report of that step's checkpoint, and nothing is scored (the committed reports
in the card's `scaling/` folder redraw the plot without the checkpoints).

Arguments after `--` go to `eagle3-hf diagnose` as they are. The table and the plot use the held-out side only: in
one pass every conversation is new when the head meets it, so a small `--data_limit` saves the time.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path


def wanted_steps(found: dict[int, Path], steps: list[int] | None, what_is_missing: str) -> list[int]:
    """`steps` (or every step in `found`, in order), refused with `what_is_missing` when `found` lacks any of them
    or has none."""
    wanted = sorted(found) if steps is None else steps
    missing = [step for step in wanted if step not in found]
    if missing or not wanted:
        raise SystemExit(f"{what_is_missing} for steps {missing or 'any'} (found {sorted(found)}).")
    return wanted


def checkpoint_reports(run_dir: Path, steps: list[int] | None, diagnose_args: list[str]) -> dict[int, dict]:
    """`{step: diagnose report}` for the checkpoints `run_dir/checkpoint-<step>` (all of them, or `steps`), scoring
    those without a report in `run_dir/diagnose/` first."""
    found = {
        int(path.name.removeprefix("checkpoint-")): path for path in run_dir.glob("checkpoint-*") if path.is_dir()
    }
    wanted = wanted_steps(found, steps, f"{run_dir}: no checkpoint")
    reports = {}
    for step in wanted:
        report = run_dir / "diagnose" / f"checkpoint-{step}.json"
        if not report.exists():
            command = ["eagle3-hf", "diagnose", "--head", str(found[step]), "--output", str(report), *diagnose_args]
            print("$", " ".join(command), flush=True)
            subprocess.run([sys.executable, "-m", "eagle3_hf.cli", *command[1:]], check=True)
        reports[step] = json.loads(report.read_text(encoding="utf-8"))
    return reports


def template_reports(template: str, steps: list[int] | None) -> dict[int, dict]:
    """`{step: report}` read from the files matching `template`, a path with `{step}` in its file name (all of
    them, or `steps`)."""
    path = Path(template)
    if "{step}" not in path.name:
        raise SystemExit(f"{template}: a run given by its reports needs '{{step}}' in the file name.")
    prefix, suffix = path.name.split("{step}", 1)
    pattern = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(suffix) + "$")
    found = {
        int(match.group(1)): candidate
        for candidate in path.parent.glob(prefix + "*" + suffix)
        if (match := pattern.match(candidate.name))
    }
    wanted = wanted_steps(found, steps, f"{template}: no report")
    return {step: json.loads(found[step].read_text(encoding="utf-8")) for step in wanted}


def table(rows: list[tuple[str, int | None, dict]]) -> str:
    """Markdown: one row per (run, conversations seen or `None` for a reference head, report)."""
    lines = [
        "| run | conversations | held-out top-1, steps 0 / 1 / 2 | held-out top-8, step 0 "
        "| held-out acceptance (simulated) |",
        "|---|---|---|---|---|",
    ]
    for label, conversations, report in rows:
        heldout = report["splits"]["heldout"]
        seen = "-" if conversations is None else f"{conversations:,}"
        lines.append(
            f"| {label} | {seen} | {' / '.join(f'{v:.3f}' for v in heldout['top1'][:3])} "
            f"| {heldout['top8'][0]:.3f} | {heldout['acceptance_length']:.3f} |"
        )
    return "\n".join(lines)


def tick_positions(
    runs: dict[str, dict[int, dict]], per_step: int, points: dict[str, tuple[int, dict]], min_ratio: float = 1.3
) -> list[int]:
    """The x ticks: the conversation counts the runs' checkpoints and the markers stand at, in order, leaving out
    any within `min_ratio` of the tick before it (on the log scale 4,828 would print over 4,800, and slanted 26,357
    still over 22,024; 13,200 after 9,600 fits)."""
    seen = {step * per_step for reports in runs.values() for step in reports}
    ticks = []
    for count in sorted(seen | {conversations for conversations, _ in points.values()}):
        if not ticks or count >= ticks[-1] * min_ratio:
            ticks.append(count)
    return ticks


def plot(
    runs: dict[str, dict[int, dict]],
    per_step: int,
    references: dict[str, dict],
    output: Path,
    points: dict[str, tuple[int, dict]] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (accuracy_axes, acceptance_axes) = plt.subplots(1, 2, figsize=(11, 7))
    styles = ["-", "--", ":", "-."]
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for style, (label, reports) in zip(styles, runs.items()):
        seen = [step * per_step for step in reports]
        for k, color in enumerate(colors):
            values = [report["splits"]["heldout"]["top1"][k] for report in reports.values()]
            accuracy_axes.plot(seen, values, style, marker="o", color=color, label=f"{label}, step {k}")
        acceptance = [report["splits"]["heldout"]["acceptance_length"] for report in reports.values()]
        acceptance_axes.plot(seen, acceptance, style, marker="o", color="black", label=label)
    for line, (name, report) in zip(("-", "--", ":", "-."), references.items()):  # told apart by their dashes
        heldout = report["splits"]["heldout"]
        accuracy_axes.axhline(heldout["top1"][0], ls=line, color="gray", lw=0.9, label=f"{name}, step 0")
        acceptance_axes.axhline(heldout["acceptance_length"], ls=line, color="gray", lw=0.9, label=name)
    for marker, (name, (conversations, report)) in zip("*Dsp", (points or {}).items()):
        for k, color in enumerate(colors):
            value = report["splits"]["heldout"]["top1"][k]
            accuracy_axes.plot([conversations], [value], marker, color=color, ms=9, label=f"{name}, step {k}")
        acceptance = report["splits"]["heldout"]["acceptance_length"]
        acceptance_axes.plot([conversations], [acceptance], marker, color="black", ms=9, label=name)
    seen = tick_positions(runs, per_step, points or {})
    for axes, ylabel in ((accuracy_axes, "held-out top-1 accuracy"), (acceptance_axes, "held-out acceptance length")):
        axes.set_xscale("log", base=2)
        # slanted, so that neighbours on the log scale (9,600 and 13,200) do not overwrite each other
        axes.set_xticks(seen, [f"{count:,}" for count in seen], rotation=35, ha="right")
        axes.minorticks_off()
        axes.set_xlabel("training conversations seen (repeats counted)")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        # below the axes: inside, a dozen entries hid the lines they name
        axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    accuracy_axes.set_title("Draft top-1 vs the target's greedy token")
    acceptance_axes.set_title("Simulated greedy-chain acceptance (7 steps)")
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110, bbox_inches="tight")
    print(f"Plot written to {output}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, diagnose_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        help="LABEL=RUN_DIR (a training output_dir) or LABEL=REPORTS (a path with {step})",
    )
    parser.add_argument("--steps", type=int, nargs="+", help="checkpoint steps to score (default: all)")
    parser.add_argument("--conversations-per-step", type=int, required=True, help="the run's total batch size")
    parser.add_argument("--reference", action="append", default=[], help="LABEL=REPORT.json: a horizontal line")
    parser.add_argument(
        "--point",
        action="append",
        default=[],
        help="LABEL=CONVERSATIONS:REPORT.json: one head trained otherwise (e.g. a decayed end), a marker at that x",
    )
    parser.add_argument("--output", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(own)
    runs, rows = {}, []
    for spec in args.run:
        label, _, run_dir = spec.partition("=")
        if "{step}" in run_dir:
            runs[label] = template_reports(run_dir, args.steps)
        else:
            runs[label] = checkpoint_reports(Path(run_dir), args.steps, diagnose_args)
        rows += [(label, step * args.conversations_per_step, report) for step, report in runs[label].items()]
    references = {}
    for spec in args.reference:
        label, _, path = spec.partition("=")
        references[label] = json.loads(Path(path).read_text(encoding="utf-8"))
        rows.append((label, None, references[label]))
    points = {}
    for spec in args.point:
        label, _, rest = spec.partition("=")
        conversations, _, path = rest.partition(":")
        if not conversations.isdigit() or not path:
            parser.error(f"--point {spec!r}: expected LABEL=CONVERSATIONS:REPORT.json")
        points[label] = (int(conversations), json.loads(Path(path).read_text(encoding="utf-8")))
        rows.append((label, int(conversations), points[label][1]))
    print(table(rows))
    plot(runs, args.conversations_per_step, references, args.output, points)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
