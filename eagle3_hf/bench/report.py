"""Write benchmark results: `results.json` (everything), `results.md` (tables) and PNG plots."""

import json
from pathlib import Path

from ..atomic import write_text_atomically
from .measure import TREE_METHODS


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _share(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def _speedup(row: dict) -> str:
    """`1.23x`, with the 95% interval when there is one: `1.23x (1.15-1.31)`."""
    text = f"{_fmt(row['speedup'])}x"
    interval = row.get("speedup_interval")
    return f"{text} ({interval[0]:.2f}-{interval[1]:.2f})" if interval else text


def markdown_table(summary: dict, machine: str = "", command: str = "") -> str:
    """Markdown tables: per dataset (tau, tokens/s, speedup with its 95% interval over prompts, the shares of the
    head's rounds that drafted a tree and that ran on fewer torch threads than the caller's, greedy mismatches; "-"
    where the method has no such rounds or no output was compared with plain `generate`), then per MT-bench
    category."""
    header = "| dataset | T | method | tau | tokens/s | speedup | tree rounds | fewer threads | greedy mismatches "
    header += "| generations |\n|---|---|---|---|---|---|---|---|---|---|\n"
    main, categories = header, header
    for row in summary["rows"]:
        line = (
            f"| {row['dataset']} | {row['temperature']:g} | {row['method']} | {_fmt(row['tau'])} | "
            f"{_fmt(row['tokens_per_second'], 1)} | {_speedup(row)} | {_share(row.get('tree_round_share'))} | "
            f"{_share(row.get('fewer_threads_share'))} | {_fmt(row['greedy_mismatches'], 0)} | "
            f"{row['generations']} |\n"
        )
        if "/" in row["dataset"]:
            categories += line
        else:
            main += line
    text = ""
    if machine or command:
        text += f"Machine: {machine}\n\nCommand: `{command}`\n\n"
    text += main
    if categories != header:
        text += "\nMT-bench by category:\n\n" + categories
    acceptance = [
        row
        for row in summary["rows"]
        if row["acceptance_by_position"] and "/" not in row["dataset"] and row["method"] in TREE_METHODS
    ]
    if acceptance:
        text += "\nAcceptance rate by draft position (P(accept k | accepted k-1)):\n\n"
        for row in acceptance:
            rates = ", ".join(f"{rate:.2f}" for rate in row["acceptance_by_position"])
            text += f"- {row['dataset']} T={row['temperature']:g} {row['method']}: {rates}\n"
    return text


def write_plots(summary: dict, out_dir: Path) -> list[Path]:
    """Bar charts of speedup and tau per dataset and method, and acceptance-by-position curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in summary["rows"] if "/" not in row["dataset"]]
    paths = []
    for metric in ("speedup", "tau"):
        keys = sorted({(row["dataset"], row["temperature"]) for row in rows})
        methods = sorted({row["method"] for row in rows})
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 4))
        width = 0.8 / max(1, len(methods))
        for m, method in enumerate(methods):
            values = []
            for key in keys:
                match = [r for r in rows if (r["dataset"], r["temperature"]) == key and r["method"] == method]
                values.append((match[0][metric] or 0.0) if match else 0.0)
            ax.bar([k + m * width for k in range(len(keys))], values, width, label=method)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
        ax.set_xticklabels([f"{d}\nT={t:g}" for d, t in keys])
        ax.set_ylabel(metric)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{metric}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        if row["method"] in TREE_METHODS and row["acceptance_by_position"]:
            rates = row["acceptance_by_position"]
            ax.plot(
                range(1, len(rates) + 1),
                rates,
                marker="o",
                label=f"{row['dataset']} T={row['temperature']:g} {row['method']}",
            )
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "acceptance_by_position.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return paths + [path]


def write_report(
    summary: dict, out_dir: str | Path, machine: str = "", command: str = "", plots: bool = True
) -> list[Path]:
    """Write `results.json`, `results.md` and (optionally) the plots into `out_dir`; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    # renamed into place once complete: `push --results` reads it, and a killed run must not leave half of it
    write_text_atomically(json_path, json.dumps({"machine": machine, "command": command, **summary}, indent=1))
    md_path = out_dir / "results.md"
    write_text_atomically(md_path, markdown_table(summary, machine, command))
    paths = [json_path, md_path]
    if plots:
        paths += write_plots(summary, out_dir)
    return paths
