"""Pure tree functions: rerank, ancestor masks, positions, paths, node sequences, greedy and sampling acceptance."""

import pytest
import torch

from eagle3_hf.generation.tree import (
    DraftTree,
    additive_mask,
    ancestor_matrix,
    build_tree,
    graft_chain,
    greedy_accept,
    node_sequences,
    path_to,
    prune_tree,
    retrieve_paths,
    sample_accept,
    tree_position_ids,
    tree_visibility,
)


def make_tree(parents, tokens=None) -> DraftTree:
    parents = torch.tensor(parents)
    ancestors, depths = ancestor_matrix(parents)
    tokens = torch.arange(len(parents)) if tokens is None else torch.tensor(tokens)
    return DraftTree(tokens, parents, depths, ancestors, torch.zeros(len(parents)))


def rows(text: str) -> list[list[int]]:
    return [[int(c) for c in line.split()] for line in text.strip().splitlines()]


# 0 -> {1, 2}, 1 -> {3, 4}, 3 -> {5}
FOUR_LEVEL = [-1, 0, 0, 1, 1, 3]


def test_ancestor_matrix_and_depths():
    ancestors, depths = ancestor_matrix(torch.tensor(FOUR_LEVEL))
    assert ancestors.int().tolist() == rows(
        """
        1 0 0 0 0 0
        1 1 0 0 0 0
        1 0 1 0 0 0
        1 1 0 1 0 0
        1 1 0 0 1 0
        1 1 0 1 0 1
        """
    )
    assert depths.tolist() == [0, 1, 1, 2, 2, 3]


def test_positions_paths_and_path_to():
    tree = make_tree(FOUR_LEVEL)
    assert tree_position_ids(tree, start=10).tolist() == [[10, 11, 11, 12, 12, 13]]
    assert retrieve_paths(tree).tolist() == [[0, 2, -1, -1], [0, 1, 4, -1], [0, 1, 3, 5]]
    assert path_to(tree, 5).tolist() == [0, 1, 3, 5]
    assert path_to(tree, 0).tolist() == [0]


def test_build_tree_keeps_best_candidates_and_their_ancestors():
    # level 1: a (-0.1), b (-2.0); level 2 children of a: c (-0.3), d (-5.0); of b: e (-2.1), f (-9.0)
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    scores = torch.tensor([-0.1, -2.0, -0.3, -5.0, -2.1, -9.0])
    parents = torch.tensor([-1, -1, 0, 0, 1, 1])
    tree = build_tree(torch.tensor(99), tokens, scores, parents, num_nodes=5)
    assert tree.tokens.tolist() == [99, 10, 11, 12, 14]  # flat order: topological, siblings by draft rank
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2]
    assert torch.allclose(tree.scores, torch.tensor([0.0, -0.1, -2.0, -0.3, -2.1]))


def test_build_tree_breaks_score_ties_towards_the_parent():
    # a child with log-prob exactly 0 ties its parent; the parent must still be kept with it
    tokens = torch.tensor([10, 11, 12])
    scores = torch.tensor([-1.0, -3.0, -1.0])
    parents = torch.tensor([-1, -1, 0])
    tree = build_tree(torch.tensor(0), tokens, scores, parents, num_nodes=2)
    assert tree.tokens.tolist() == [0, 10]
    tree = build_tree(torch.tensor(0), tokens, scores, parents, num_nodes=3)
    assert tree.tokens.tolist() == [0, 10, 12] and tree.parents.tolist() == [-1, 0, 1]


def test_build_tree_caps_at_candidate_count_and_handles_root_only():
    tree = build_tree(torch.tensor(7), torch.tensor([1, 2]), torch.tensor([-1.0, -2.0]), torch.tensor([-1, -1]), 60)
    assert tree.num_nodes == 3
    empty = torch.empty(0, dtype=torch.long)
    root_only = build_tree(torch.tensor(7), empty, empty.float(), empty, 16)
    assert root_only.tokens.tolist() == [7] and root_only.ancestors.tolist() == [[True]]


def test_prune_tree_reindexes_parents():
    pruned = prune_tree(make_tree(FOUR_LEVEL, tokens=[50, 51, 52, 53, 54, 55]), max_depth=1)
    assert pruned.tokens.tolist() == [50, 51, 52] and pruned.parents.tolist() == [-1, 0, 0]
    pruned = prune_tree(make_tree([-1, 0, 1, 0, 3]), max_depth=1)
    assert pruned.parents.tolist() == [-1, 0, 0] and pruned.tokens.tolist() == [0, 1, 3]


def _graft_example():
    # root(1) -> 10 (-0.1) -> {12 (-0.3), 13 (-0.9)};  root -> 11 (-0.5) -> 14 (-0.6)
    return build_tree(
        torch.tensor(1),
        torch.tensor([10, 11, 12, 13, 14]),
        torch.tensor([-0.1, -0.5, -0.3, -0.9, -0.6]),
        torch.tensor([-1, -1, 0, 0, 1]),
        6,
    )


def test_graft_chain_follows_matching_nodes_and_replaces_the_weakest():
    tree = _graft_example()
    assert graft_chain(tree, torch.tensor([10, 12])) is tree  # already in the tree: nothing to add
    assert graft_chain(tree, torch.tensor([], dtype=torch.long)) is tree
    grafted = graft_chain(tree, torch.tensor([10, 20, 21]))  # follows 10, adds 20 -> 21 under it
    assert grafted.num_nodes == tree.num_nodes
    assert grafted.tokens.tolist() == [1, 10, 11, 12, 20, 21]  # dropped 13 (-0.9) and 14 (-0.6)
    assert grafted.parents.tolist() == [-1, 0, 0, 1, 1, 4]
    assert grafted.depths.tolist() == [0, 1, 1, 2, 2, 3]
    assert grafted.scores[-2:].tolist() == [0.0, 0.0]
    expected_ancestors, _ = ancestor_matrix(grafted.parents)
    assert torch.equal(grafted.ancestors, expected_ancestors)


def test_graft_chain_drops_children_before_parents_and_cuts_long_chains():
    tree = _graft_example()
    grafted = graft_chain(tree, torch.tensor([30, 31, 32, 33]))  # 4 new nodes: 13, 14, 11, then 12 go
    assert grafted.tokens.tolist() == [1, 10, 30, 31, 32, 33]
    assert grafted.parents.tolist() == [-1, 0, 0, 2, 3, 4]
    longest = graft_chain(tree, torch.arange(40, 50))  # only 5 nodes can make room: the chain is cut to 5
    assert longest.tokens.tolist() == [1, 40, 41, 42, 43, 44] and longest.depths.tolist() == [0, 1, 2, 3, 4, 5]


def test_tree_visibility_full_attention_with_padding():
    tree = make_tree([-1, 0, 0, 1])
    visible = tree_visibility(tree.ancestors, tree.depths, 3, 0, 3, past_keep=torch.tensor([False, True, True]))
    assert visible.int().tolist() == rows(
        """
        0 1 1 1 0 0 0
        0 1 1 1 1 0 0
        0 1 1 1 0 1 0
        0 1 1 1 1 0 1
        """
    )


def test_tree_visibility_sliding_window():
    # window 3; the layer keeps 2 past keys at absolute indices 8, 9; root at 10, depth-1 nodes at 11, depth 2 at 12
    tree = make_tree([-1, 0, 0, 1])
    visible = tree_visibility(tree.ancestors, tree.depths, 2, 8, 10, sliding_window=3)
    assert visible.int().tolist() == rows(
        """
        1 1 1 0 0 0
        0 1 1 1 0 0
        0 1 1 0 1 0
        0 0 1 1 0 1
        """
    )


def test_additive_mask_is_float_with_dtype_minimum():
    mask = additive_mask(torch.tensor([[True, False]]), torch.float16)
    assert mask.shape == (1, 1, 1, 2) and mask.dtype == torch.float16
    assert mask[0, 0, 0, 0] == 0 and mask[0, 0, 0, 1] == torch.finfo(torch.float16).min
    # training-time test's `(batch, 1, q, kv)` masks keep their shape
    batched = additive_mask(torch.tensor([[[[True, False]]]]), torch.float32)
    assert batched.tolist() == [[[[0.0, torch.finfo(torch.float32).min]]]]


def test_node_sequences_follow_each_path():
    tree = make_tree(FOUR_LEVEL, tokens=[5, 61, 62, 63, 64, 65])
    prefix = torch.tensor([[1, 2, 5]])
    nodes, sequences = node_sequences(prefix, tree, 0)
    assert nodes.tolist() == [0] and sequences.tolist() == [[1, 2, 5]]
    nodes, sequences = node_sequences(prefix, tree, 2)
    assert nodes.tolist() == [3, 4] and sequences.tolist() == [[1, 2, 5, 61, 63], [1, 2, 5, 61, 64]]
    nodes, sequences = node_sequences(prefix, tree, 3)
    assert sequences.tolist() == [[1, 2, 5, 61, 63, 65]]


def test_greedy_accept_follows_non_first_child_and_stops_at_mismatch():
    tree = make_tree(FOUR_LEVEL, tokens=[5, 61, 62, 63, 64, 65])
    # target: after root -> 61, after 61 -> 64 (second child), after 64 -> 9 (bonus)
    choices = torch.tensor([61, 64, 0, 0, 9, 0])
    path, bonus = greedy_accept(tree, choices)
    assert path.tolist() == [0, 1, 4] and bonus.item() == 9
    path, bonus = greedy_accept(tree, torch.tensor([62, 0, 3, 0, 0, 0]))  # root's second child, then a leaf
    assert path.tolist() == [0, 2] and bonus.item() == 3
    path, bonus = greedy_accept(tree, torch.tensor([77, 0, 0, 0, 0, 0]))  # nothing matches
    assert path.tolist() == [0] and bonus.item() == 77


def biased_sample_accept(tree, probs):
    """WRONG on purpose: no renormalisation after a rejected sibling, bonus from the unmodified distribution."""
    node, path = 0, [0]
    while True:
        for child in torch.nonzero(tree.parents == node).flatten().tolist():
            if torch.rand(()) < probs[node, tree.tokens[child]]:
                node = child
                path.append(child)
                break
        else:
            return torch.tensor(path), torch.multinomial(probs[node], 1)[0]


def _first_two_tokens(sampler, tree, probs, num_samples):
    counts = torch.zeros(probs.shape[1], probs.shape[1])
    for _ in range(num_samples):
        path, bonus = sampler(tree, probs)
        emitted = tree.tokens[path[1:]].tolist() + [bonus.item()]
        if len(emitted) >= 2:
            counts[emitted[0], emitted[1]] += 1
        else:  # the second token would come from the next round, drawn from the node of `emitted[0]`
            second = torch.multinomial(probs[_node_of(tree, emitted[0])], 1).item()
            counts[emitted[0], second] += 1
    return counts


def _node_of(tree, token):
    # In this tree each depth-1 token maps to one node; tokens without a node continue with node 5's row
    matches = torch.nonzero((tree.tokens == token) & (tree.depths == 1)).flatten()
    return int(matches[0]) if len(matches) else 5


def _chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    from scipy.stats import chisquare

    expected = expected_probs.flatten() * counts.sum()
    keep = expected > 0
    assert counts.flatten()[~keep].sum() == 0, "sampled a zero-probability pair"
    return float(chisquare(counts.flatten()[keep], expected[keep]).pvalue)


def test_sample_accept_matches_the_target_distribution_and_detects_bias():
    """Exact check of the multi-draft rejection rule on a hand-built tree with known per-node distributions.

    Tree: root -> {a=1, b=2, c=3}, a -> {x=4}; vocab 6. The first emitted token must follow p_root, the second
    p_{first}; the same chi-square test rejects a sampler that forgets to renormalise after a rejection.
    """
    torch.manual_seed(0)
    tree = make_tree([-1, 0, 0, 0, 1], tokens=[0, 1, 2, 3, 4])
    probs = torch.tensor(
        [
            [0.05, 0.30, 0.25, 0.10, 0.20, 0.10],  # root
            [0.10, 0.10, 0.10, 0.10, 0.50, 0.10],  # after a
            [0.30, 0.00, 0.20, 0.20, 0.10, 0.20],  # after b
            [0.00, 0.50, 0.50, 0.00, 0.00, 0.00],  # after c
            [1 / 6] * 6,  # after x (unused for the first two tokens)
            [0.40, 0.10, 0.10, 0.10, 0.20, 0.10],  # after any token without a node
        ]
    )
    second_row = torch.stack([probs[_node_of(tree, t)] for t in range(6)])
    expected = probs[0][:, None] * second_row  # P(first, second)
    counts = _first_two_tokens(lambda t, p: sample_accept(t, probs[:5]), tree, probs, 6000)
    assert _chi_square_p_value(counts, expected) > 1e-3
    biased = _first_two_tokens(lambda t, p: biased_sample_accept(t, probs[:5]), tree, probs, 6000)
    assert _chi_square_p_value(biased, expected) < 1e-6


def test_sample_accept_leaf_and_rejected_children():
    tree = make_tree([-1, 0], tokens=[0, 1])
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    path, bonus = sample_accept(tree, probs)  # the only child has probability 1: always accepted
    assert path.tolist() == [0, 1] and bonus.item() == 2
    probs = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    path, bonus = sample_accept(tree, probs)  # probability 0: always rejected, bonus from the residual
    assert path.tolist() == [0] and bonus.item() == 2


@pytest.mark.parametrize("top_k,depth", [(2, 3), (4, 5)])
def test_tree_settings_max_nodes(top_k, depth):
    from eagle3_hf.generation.decoding import TreeSettings

    assert TreeSettings(100, depth, top_k).max_nodes == 1 + top_k + (depth - 1) * top_k**2


# ------------------------------------------------------------------------------------------- sampled trees
P_ROOT = torch.tensor([0.05, 0.30, 0.25, 0.10, 0.20, 0.10])
Q_ROOT = torch.tensor([0.30, 0.05, 0.10, 0.35, 0.15, 0.05])  # a poor draft: far from P_ROOT


def _sampled_tree(num_drawn: int, chain_token: int | None) -> DraftTree:
    """root -> `num_drawn` children drawn from Q_ROOT without replacement (Gumbel top-k), then an optional
    deterministic (prompt-lookup) child, as `TreeDrafter.grow_sampled` and `append_chain` build them."""
    drawn = (Q_ROOT.log() - torch.log(-torch.log(torch.rand(6)))).topk(num_drawn).indices
    tokens = [0, *drawn.tolist()] + ([] if chain_token is None else [chain_token])
    tree = make_tree([-1] + [0] * (len(tokens) - 1), tokens=tokens)
    tree.sampled = torch.tensor([False] + [True] * num_drawn + [False] * (chain_token is not None))
    tree.draft_probs = torch.zeros(len(tokens), 6)
    tree.draft_probs[0] = Q_ROOT
    return tree


def rrs_without_draft_update(tree, probs):
    """WRONG on purpose: after a rejected sampled child the residual is updated but the child is not removed from
    the draft distribution the next sibling is compared against."""
    residual = probs[0].double()
    for child in range(1, tree.num_nodes):
        token, q = int(tree.tokens[child]), tree.draft_probs[0].double()
        if torch.rand(()) * q[token] < residual[token]:
            return torch.tensor([0, child]), torch.tensor(0)
        left = torch.clamp(residual - q, min=0)
        residual = left / left.sum()
    return torch.tensor([0]), torch.multinomial(residual.float(), 1)[0]


def _first_token_counts(sampler, num_drawn, chain_token, num_samples=6000):
    counts = torch.zeros(6)
    probs = torch.stack([P_ROOT] * (num_drawn + 2))
    for _ in range(num_samples):
        tree = _sampled_tree(num_drawn, chain_token)
        path, bonus = sampler(tree, probs[: tree.num_nodes])
        counts[int(tree.tokens[path[1]]) if len(path) > 1 else int(bonus)] += 1
    return counts


@pytest.mark.parametrize("num_drawn, chain_token", [(1, None), (3, None), (2, 1), (3, 3)], ids=str)
def test_sample_accept_on_drawn_children_emits_the_target_distribution(num_drawn, chain_token):
    """Children drawn from a draft far from the target, verified by recursive rejection sampling: the emitted
    token follows P_ROOT exactly, with a deterministic lookup child next to them too (token 3 often duplicates a
    drawn sibling)."""
    from scipy.stats import chisquare

    torch.manual_seed(num_drawn)
    counts = _first_token_counts(sample_accept, num_drawn, chain_token)
    assert chisquare(counts, P_ROOT * counts.sum()).pvalue > 1e-3


def test_sampled_children_are_accepted_more_often_and_a_wrong_rule_is_detected():
    from scipy.stats import chisquare

    torch.manual_seed(0)
    accepted = {True: 0, False: 0}
    probs = torch.stack([P_ROOT] * 4)
    for _ in range(3000):
        tree = _sampled_tree(3, None)
        accepted[True] += len(sample_accept(tree, probs)[0]) > 1
        tree.sampled = None  # the same children under the top-k rule (q = 1): still exact, but accepts less
        accepted[False] += len(sample_accept(tree, probs)[0]) > 1
    assert accepted[True] > 1.1 * accepted[False]
    counts = _first_token_counts(rrs_without_draft_update, 3, None)
    assert chisquare(counts, P_ROOT * counts.sum()).pvalue < 1e-6


def test_sample_accept_leaves_a_float64_tree_unchanged():
    torch.manual_seed(0)
    tree = _sampled_tree(3, None)
    tree.draft_probs = tree.draft_probs.double()
    before = tree.draft_probs.clone()
    undrawn = next(t for t in range(6) if t not in tree.tokens[1:].tolist())
    probs = torch.zeros(4, 6, dtype=torch.float64)
    probs[:, undrawn] = 1  # the target only emits a token no child holds: every child is rejected
    assert len(sample_accept(tree, probs)[0]) == 1
    assert torch.equal(tree.draft_probs, before)


def test_append_chain_adds_deterministic_nodes_and_graft_chain_refuses_sampled_trees():
    from eagle3_hf.generation.tree import append_chain

    torch.manual_seed(0)
    tree = append_chain(_sampled_tree(2, None), torch.tensor([4, 5]))
    assert tree.num_nodes == 5 and tree.parents.tolist()[3:] == [0, 3] and tree.depths.tolist()[3:] == [1, 2]
    assert tree.sampled.tolist() == [False, True, True, False, False] and tree.draft_probs.shape == (5, 6)
    with pytest.raises(ValueError, match="use append_chain"):
        graft_chain(tree, torch.tensor([1]))
