"""`TreeDrafter`: the sampled trees of `grow_sampled` (the top-k trees of `grow` are covered through decoding)."""

import pytest
import torch

from eagle3_hf.generation.drafter import TreeDrafter, level_budgets
from eagle3_hf.target import gather_target_features


@pytest.fixture
def drafter(tiny_target, tiny_draft):
    tiny_draft.attach_target(tiny_target)
    prompt = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        layers = list(tiny_draft.config.target_layer_ids)
        hidden = tiny_target(prompt, output_hidden_states=layers).hidden_states
        drafter = TreeDrafter(tiny_draft, top_k=4)
        drafter.extend(prompt[:, 1:], gather_target_features(hidden, layers)[:, :-1])  # pairs (x[j + 1], F[j])
    return drafter, prompt


def test_sampled_tree_splits_its_nodes_over_levels_and_keeps_the_draft_distributions(drafter):
    drafter, prompt = drafter
    length = drafter.stable_length
    torch.manual_seed(0)
    with torch.no_grad():
        tree = drafter.grow_sampled(prompt[0, -1], depth=3, num_nodes=8, temperature=1.0)
    assert drafter.stable_length == length  # the temporary tree entries are cropped
    assert tree.num_nodes == 8 and torch.bincount(tree.depths).tolist() == [1, 3, 2, 2]  # 7 = 3 + 2 + 2
    assert tree.sampled.tolist() == [False] + [True] * 7
    for node in range(8):
        children = tree.tokens[tree.parents == node]
        assert len(set(children.tolist())) == len(children)  # drawn without replacement
        if len(children):
            q = tree.draft_probs[node]
            assert q.sum().item() == pytest.approx(1.0, abs=1e-5) and bool((q[children] > 0).all())
    assert tree.scores[1:].max() <= 0 and bool((tree.scores[1:] <= tree.scores[tree.parents[1:]]).all())


def test_level_budgets_give_every_level_a_node_before_halving_the_spare():
    assert level_budgets(6, 4) == [2, 2, 1, 1]  # a 12-node tree whose lookup chain took 5 nodes
    assert level_budgets(11, 4) == [5, 3, 2, 1]
    assert level_budgets(7, 3) == [3, 2, 2]
    assert level_budgets(2, 4) == [1, 1, 0, 0] and level_budgets(0, 2) == [0, 0]
    for drawn in range(20):
        for depth in range(1, 6):
            budgets = level_budgets(drawn, depth)
            assert len(budgets) == depth and sum(budgets) == drawn and min(budgets) >= 0
            assert all(budget >= 1 for budget in budgets[: min(drawn, depth)])  # no level empty while nodes last


def test_sampled_children_follow_the_head_distribution_at_the_temperature(drafter):
    """The first child of the root is one draw from `softmax(logits / T)`: chi-square over 3000 trees."""
    from scipy.stats import chisquare

    drafter, prompt = drafter
    torch.manual_seed(0)
    counts, q = torch.zeros(128), None
    with torch.no_grad():
        for _ in range(3000):
            tree = drafter.grow_sampled(prompt[0, -1], depth=1, num_nodes=2, temperature=0.5)
            counts[tree.tokens[1]] += 1
            q = tree.draft_probs[0]
    expected = q * counts.sum()
    assert counts[q == 0].sum() == 0  # never a token outside the draft vocabulary
    big = expected >= 5  # pool the rare draft tokens into one cell
    observed, predicted = counts[big], expected[big]
    if expected[~big].sum() > 0:
        observed = torch.cat([observed, counts[~big].sum()[None]])
        predicted = torch.cat([predicted, expected[~big].sum()[None]])
    assert chisquare(observed, predicted * observed.sum() / predicted.sum()).pvalue > 1e-3
    logits = drafter._last_logits.float() / 0.5
    target_ids = drafter.draft.draft_to_target_ids(torch.arange(logits.shape[0]))
    assert torch.allclose(q[target_ids], torch.softmax(logits, dim=-1), atol=1e-6)


def test_root_confidence_is_the_largest_probability_the_first_level_is_drawn_from(drafter):
    """The root confidence is the largest probability of the distribution the next tree's first level comes from:
    the root's children in a sampled tree at that temperature, the top-1 child of a greedy tree at temperature 1."""
    drafter, prompt = drafter
    with torch.no_grad():
        sampled = drafter.grow_sampled(prompt[0, -1], depth=1, num_nodes=2, temperature=0.5)
        greedy = drafter.grow(prompt[0, -1], depth=1, num_nodes=2)
    assert drafter.root_confidence(0.5) == pytest.approx(float(sampled.draft_probs[0].max()), rel=1e-5)
    assert drafter.root_confidence() == pytest.approx(float(greedy.scores[1].exp()), rel=1e-5)
    assert drafter.root_confidence(0.5) > drafter.root_confidence(1.0)  # sharper at a lower temperature
