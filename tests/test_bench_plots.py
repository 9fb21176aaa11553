"""Draft-tree pictures and training curves: layout arithmetic, labels, highlighting, clear errors."""

import doctest

import matplotlib


matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from eagle3_hf.bench import plots as visualization  # noqa: E402
from eagle3_hf.bench.plots import (  # noqa: E402
    ACCEPTED_COLOR,
    DRAFT_COLOR,
    ROOT_COLOR,
    log_history_series,
    lookup_nodes,
    plot_draft_tree,
    plot_log_history,
    token_label,
    tree_layout,
)
from eagle3_hf.generation.tree import DraftTree, ancestor_matrix  # noqa: E402


class CharTokenizer:
    """Decodes id `i` to the `i`-th entry of a fixed table (enough to test labels)."""

    table = ["<root>", " the", "\n", "$x$", "a" * 30, "cat"]

    def decode(self, ids):
        return "".join(self.table[i] for i in ids)


def make_tree(parents: list[int], tokens: list[int]) -> DraftTree:
    parents = torch.tensor(parents)
    ancestors, depths = ancestor_matrix(parents)
    scores = -0.5 * depths.float()  # probability exp(-0.5 * depth)
    return DraftTree(torch.tensor(tokens), parents, depths, ancestors, scores)


def node_boxes(ax) -> dict[int, object]:
    return {int(text.get_gid().split("-")[1]): text for text in ax.texts if (text.get_gid() or "").startswith("node-")}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


class TestTreeLayout:
    def test_parents_centred_over_children_and_leaves_one_apart(self):
        #        0
        #      / | \
        #     1  2  3
        #    / \     \
        #   4   5     6
        positions = tree_layout([-1, 0, 0, 0, 1, 1, 3])
        assert positions[:, 1].tolist() == [0.0, -1.0, -1.0, -1.0, -2.0, -2.0, -2.0]
        # leaves depth-first, siblings in node order: 4, 5, 2, 6
        assert positions[[4, 5, 2, 6], 0].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert positions[1, 0] == 0.5 and positions[3, 0] == 3.0
        assert positions[0, 0] == pytest.approx((0.5 + 2.0 + 3.0) / 3)

    def test_single_node_and_chain(self):
        assert tree_layout([-1]).tolist() == [[0.0, 0.0]]
        assert tree_layout(torch.tensor([-1, 0, 1])).tolist() == [[0.0, 0.0], [0.0, -1.0], [0.0, -2.0]]

    @pytest.mark.parametrize("parents", [[], [0, 0], [-1, 2, 0], [-1, 0, -1]])
    def test_rejects_non_topological_parents(self, parents):
        with pytest.raises(ValueError, match="parents="):
            tree_layout(parents)

    def test_docstring_examples(self):
        finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
        for test in finder.find(visualization):
            runner.run(test)
        assert runner.failures == 0 and runner.tries >= 2


class TestTokenLabel:
    def test_spaces_newlines_and_length(self):
        tokenizer = CharTokenizer()
        assert token_label(tokenizer, 1) == "␣the"
        assert token_label(tokenizer, 2) == "\\n"
        assert token_label(tokenizer, 4, max_chars=8) == "a" * 7 + "…"
        assert token_label(None, 42) == "42"


class TestPlotDraftTree:
    def test_labels_scores_and_highlighted_path(self):
        tree = make_tree([-1, 0, 0, 1, 3], [0, 1, 5, 3, 2])
        ax = plot_draft_tree(tree, CharTokenizer(), accepted_path=torch.tensor([0, 1, 3]), title="round 3")
        boxes = node_boxes(ax)
        assert sorted(boxes) == [0, 1, 2, 3, 4]
        assert boxes[0].get_text() == "<root>"  # the root carries no draft probability
        assert boxes[1].get_text() == f"␣the\n{torch.tensor(-0.5).exp():.2f}"
        assert boxes[3].get_text().startswith("$x$") and not boxes[3].get_parse_math()
        colors = {node: mcolors.to_hex(box.get_bbox_patch().get_facecolor()) for node, box in boxes.items()}
        assert colors == {0: ROOT_COLOR, 1: ACCEPTED_COLOR, 2: DRAFT_COLOR, 3: ACCEPTED_COLOR, 4: DRAFT_COLOR}
        assert len(ax.lines) == 4  # one edge per non-root node
        assert sorted(line.get_linewidth() for line in ax.lines) == [1.0, 1.0, 2.5, 2.5]
        assert ax.get_title() == "round 3"

    def test_without_tokenizer_path_or_scores(self):
        fig, ax = plt.subplots()
        tree = make_tree([-1, 0, 0], [7, 8, 9])
        assert plot_draft_tree(tree, ax=ax, show_scores=False) is ax
        boxes = node_boxes(ax)
        assert [boxes[n].get_text() for n in range(3)] == ["7", "8", "9"]
        assert {mcolors.to_hex(boxes[n].get_bbox_patch().get_facecolor()) for n in (1, 2)} == {DRAFT_COLOR}

    def test_grafted_lookup_nodes_are_labelled_lookup(self):
        from eagle3_hf.generation.tree import append_chain, graft_chain

        tree = make_tree([-1, 0, 0, 1], [0, 1, 2, 3])
        grafted = graft_chain(tree, torch.tensor([1, 5, 4]))  # follows node 1, then two new nodes of score 0
        boxes = node_boxes(plot_draft_tree(grafted, CharTokenizer()))
        labels = [boxes[n].get_text().split("\n")[1] for n in range(1, grafted.num_nodes)]
        assert labels == [f"{torch.tensor(-0.5).exp():.2f}", "lookup", "lookup"]
        fields = (tree.tokens, tree.parents, tree.depths, tree.ancestors, tree.scores)
        sampled = DraftTree(*fields, sampled=torch.tensor([False, True, True, True]))
        appended = append_chain(sampled, torch.tensor([7]))
        assert lookup_nodes(appended).tolist() == [False, False, False, False, True]

    @pytest.mark.parametrize("path", [[1, 3], [0, 2, 3], [0, 9], []])
    def test_rejects_a_path_that_is_not_in_the_tree(self, path):
        tree = make_tree([-1, 0, 0, 1], [0, 1, 2, 3])
        with pytest.raises(ValueError, match="accepted_path="):
            plot_draft_tree(tree, accepted_path=path)


LOG_HISTORY = [
    {"loss": 3.0, "acc_step_0": 0.1, "acc_step_1": 0.05, "step": 1},
    {"loss": 2.0, "acc_step_0": 0.3, "acc_step_1": 0.2, "step": 2},
    {"eval_loss": 2.5, "eval_acc_step_0": 0.25, "step": 2},
    {"train_runtime": 10.0, "step": 2},
]


class TestLogHistory:
    def test_series_keep_only_entries_with_the_metric(self):
        series = log_history_series(LOG_HISTORY, ["acc_step_0", "eval_acc_step_0"])
        assert series == {"acc_step_0": ([1, 2], [0.1, 0.3]), "eval_acc_step_0": ([2], [0.25])}

    def test_plot_one_line_per_metric(self):
        ax = plot_log_history(LOG_HISTORY, ["acc_step_0", "acc_step_1"], labels=["k=0", "k=1"], ylabel="accuracy")
        assert [line.get_label() for line in ax.lines] == ["k=0", "k=1"]
        assert ax.lines[1].get_xydata().tolist() == [[1.0, 0.05], [2.0, 0.2]]
        assert ax.get_ylabel() == "accuracy"

    def test_unknown_metric_names_the_logged_ones(self):
        with pytest.raises(ValueError, match=r"\['acc_step_7'\].*acc_step_0"):
            plot_log_history(LOG_HISTORY, ["acc_step_0", "acc_step_7"])

    def test_labels_must_match_names(self):
        with pytest.raises(ValueError, match="labels has 1 entries for 2 names"):
            plot_log_history(LOG_HISTORY, ["acc_step_0", "acc_step_1"], labels=["only one"])
