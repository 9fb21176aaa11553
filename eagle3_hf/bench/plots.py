"""Pictures for notebooks and reports: a draft tree with its accepted path, and training curves.

matplotlib (the `real` extra) is imported only inside the plotting functions; `tree_layout`, `token_label` and
`log_history_series` are plain functions that need no plotting library.
"""

from collections.abc import Sequence
from typing import Any

import torch

from ..generation.tree import DraftTree


ROOT_COLOR = "#cfe2ff"
ACCEPTED_COLOR = "#b7e4c7"
ACCEPTED_EDGE_COLOR = "#2d6a4f"
DRAFT_COLOR = "#f1f3f5"
DRAFT_EDGE_COLOR = "#adb5bd"


def tree_layout(parents: torch.LongTensor | Sequence[int]) -> torch.FloatTensor:
    """Positions for drawing a tree: leaves one unit apart, each parent centred over its children, `y = -depth`.

    Leaves are ordered depth-first with siblings in node order (the draft rank), so the top-ranked branch is drawn
    leftmost and no edges cross.

    Args:
        parents (`torch.LongTensor` of shape `(N,)` or a list): parent index per node, -1 for the root (node 0);
            topological order (every parent before its children), as in [`DraftTree`].

    Returns:
        `torch.FloatTensor` of shape `(N, 2)`: `(x, y)` per node.

    Example:
        >>> tree_layout([-1, 0, 0, 1]).tolist()
        [[0.5, 0.0], [0.0, -1.0], [1.0, -1.0], [0.0, -2.0]]
    """
    parents = [int(p) for p in parents]
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"parents={parents} must start with -1 (the root) and list every parent before its child.")
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents[1:], start=1):
        children[parent].append(node)
    x = [0.0] * len(parents)
    depth = [0] * len(parents)
    next_leaf, stack = 0, [0]
    while stack:  # depth-first, siblings in node order: reversed onto the stack so the first child pops first
        node = stack.pop()
        if children[node]:
            for child in reversed(children[node]):
                depth[child] = depth[node] + 1
                stack.append(child)
        else:
            x[node], next_leaf = float(next_leaf), next_leaf + 1
    for node in reversed(range(len(parents))):  # children have larger indices than their parent
        if children[node]:
            x[node] = sum(x[child] for child in children[node]) / len(children[node])
    return torch.tensor([[x[node], float(-depth[node])] for node in range(len(parents))])


def token_label(tokenizer: Any, token_id: int, max_chars: int = 12) -> str:
    """A token as readable node text: decoded, spaces shown as `␣`, control characters escaped, long ones cut.

    Without a tokenizer the id itself is the label.
    """
    if tokenizer is None:
        return str(int(token_id))
    text = tokenizer.decode([int(token_id)])
    text = repr(text)[1:-1].replace(" ", "␣")  # repr escapes newlines and tabs; visible spaces matter in BPE
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _check_path(tree: DraftTree, path: Sequence[int]) -> list[int]:
    path = [int(node) for node in path]
    parents = tree.parents.tolist()
    valid = bool(path) and path[0] == 0 and all(0 <= node < len(parents) for node in path)
    if not valid or any(parents[child] != parent for parent, child in zip(path, path[1:])):
        raise ValueError(f"accepted_path={path} is not a path from the root (node 0) down the tree.")
    return path


def lookup_nodes(tree: DraftTree) -> torch.BoolTensor:
    """`(N,)` True for the prompt-lookup nodes grafted onto `tree` (`tree.graft_chain` / `tree.append_chain`).

    In a sampled tree they are the nodes below the root that were not drawn (`tree.sampled` False). Otherwise they
    are the nodes below the root with score exactly 0, which grafting gives them: a head node scores its cumulative
    draft log-probability, below 0 unless the head put probability 1.0 (in float32) on every token of its path.
    """
    below_root = tree.parents >= 0
    if tree.sampled is not None:
        return below_root & ~tree.sampled
    return below_root & (tree.scores == 0)


def plot_draft_tree(
    tree: DraftTree,
    tokenizer: Any = None,
    accepted_path: torch.LongTensor | Sequence[int] | None = None,
    ax=None,
    show_scores: bool = True,
    max_label_chars: int = 12,
    title: str | None = None,
):
    """Draw one round's draft tree, tokens as node labels, the accepted path highlighted.

    Args:
        tree ([`DraftTree`]): e.g. `output.draft_trees[i]` of `target.generate(..., assistant_model=draft,
            return_dict_in_generate=True, output_draft_trees=True)`.
        tokenizer (*optional*): decodes the node tokens; without it nodes show token ids.
        accepted_path (`torch.LongTensor` of shape `(k,)`, *optional*): node indices from the root, e.g.
            `output.accepted_paths[i]`; drawn in green.
        ax (`matplotlib.axes.Axes`, *optional*): where to draw; a new figure sized to the tree by default.
        show_scores (`bool`, defaults to `True`): write each node's cumulative draft probability (`exp(score)`)
            under its token; the tree keeps the nodes with the highest ones. Grafted prompt-lookup nodes
            (`lookup_nodes`), which no draft probability ranks, read "lookup" instead.
        max_label_chars (`int`, defaults to 12): longer token texts are cut.
        title (`str`, *optional*): the axes title.

    Returns:
        The `matplotlib.axes.Axes` drawn on.
    """
    import matplotlib.pyplot as plt

    path = _check_path(tree, accepted_path) if accepted_path is not None else []
    on_path = set(path)
    positions = tree_layout(tree.parents.cpu())
    if ax is None:
        width = float(positions[:, 0].max()) + 1
        height = -float(positions[:, 1].min()) + 1
        _, ax = plt.subplots(figsize=(max(6.0, 1.3 * width), max(2.5, 1.1 * height)))
    for node, parent in enumerate(tree.parents.tolist()):
        if parent < 0:
            continue
        accepted = node in on_path
        ax.plot(
            *positions[[parent, node]].T.tolist(),
            color=ACCEPTED_EDGE_COLOR if accepted else DRAFT_EDGE_COLOR,
            linewidth=2.5 if accepted else 1.0,
            zorder=1,
        )
    scores = tree.scores.float().exp().tolist()
    lookup = lookup_nodes(tree).tolist()
    for node, token in enumerate(tree.tokens.tolist()):
        label = token_label(tokenizer, token, max_label_chars)
        if show_scores and node > 0:
            label += "\nlookup" if lookup[node] else f"\n{scores[node]:.2f}"
        face = ROOT_COLOR if node == 0 else ACCEPTED_COLOR if node in on_path else DRAFT_COLOR
        edge = ACCEPTED_EDGE_COLOR if node in on_path else DRAFT_EDGE_COLOR
        x, y = positions[node].tolist()
        # parse_math=False: tokens such as "$" must not switch matplotlib into mathtext.
        ax.text(
            x,
            y,
            label,
            ha="center",
            va="center",
            fontsize=9,
            parse_math=False,
            zorder=2,
            bbox=dict(boxstyle="round,pad=0.3", facecolor=face, edgecolor=edge),
            gid=f"node-{node}",
        )
    ax.set_xlim(float(positions[:, 0].min()) - 0.7, float(positions[:, 0].max()) + 0.7)
    ax.set_ylim(float(positions[:, 1].min()) - 0.6, 0.6)
    ax.set_yticks([-d for d in range(int(tree.depths.max()) + 1)])
    ax.set_yticklabels([f"depth {d}" for d in range(int(tree.depths.max()) + 1)])
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    if title is not None:
        ax.set_title(title)
    return ax


def log_history_series(log_history: list[dict], names: Sequence[str]) -> dict[str, tuple[list[int], list[float]]]:
    """`{name: (steps, values)}` from a `Trainer`'s `state.log_history`, for the entries that hold `name`.

    Args:
        log_history (`list[dict]`): `trainer.state.log_history`; each entry has a `"step"`.
        names (`list[str]`): metric names, e.g. `["acc_step_0", "eval_acceptance_length"]`.

    Example:
        >>> log_history_series([{"loss": 2.0, "step": 1}, {"eval_loss": 1.5, "step": 1}, {"loss": 1.0, "step": 2}],
        ...                    ["loss"])
        {'loss': ([1, 2], [2.0, 1.0])}
    """
    series = {}
    for name in names:
        entries = [entry for entry in log_history if name in entry]
        series[name] = ([int(entry["step"]) for entry in entries], [float(entry[name]) for entry in entries])
    return series


def plot_log_history(
    log_history: list[dict],
    names: Sequence[str],
    ax=None,
    labels: Sequence[str] | None = None,
    ylabel: str | None = None,
    title: str | None = None,
):
    """Plot metrics of a `Trainer`'s `state.log_history` against the optimizer step, one line per name.

    Args:
        log_history (`list[dict]`): `trainer.state.log_history`.
        names (`list[str]`): metrics to plot, e.g. `[f"acc_step_{k}" for k in range(args.ttt_steps)]`. A name that
            no entry holds raises `ValueError` (a typo would otherwise draw an empty plot).
        ax (`matplotlib.axes.Axes`, *optional*): where to draw; a new figure by default.
        labels (`list[str]`, *optional*): legend labels, defaults to `names`.
        ylabel, title (`str`, *optional*): axis label and title.

    Returns:
        The `matplotlib.axes.Axes` drawn on.
    """
    import matplotlib.pyplot as plt

    series = log_history_series(log_history, names)
    missing = [name for name, (steps, _) in series.items() if not steps]
    if missing:
        logged = sorted({key for entry in log_history for key in entry})
        raise ValueError(f"No log_history entry holds {missing}; logged metrics: {logged}.")
    if labels is not None and len(labels) != len(names):
        raise ValueError(f"labels has {len(labels)} entries for {len(names)} names.")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, label in zip(names, labels or names):
        steps, values = series[name]
        ax.plot(steps, values, marker="o", markersize=3, label=label)
    ax.set_xlabel("optimizer step")
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


__all__ = ["log_history_series", "lookup_nodes", "plot_draft_tree", "plot_log_history", "token_label", "tree_layout"]
