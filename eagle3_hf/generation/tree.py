"""EAGLE-2 dynamic draft trees as plain tensors: selection, masks, positions, paths and acceptance.

No `nn.Module` and no model state lives here. A tree of `N` nodes is described by four tensors (node 0 is the
root, i.e. the last token already chosen; the other nodes are draft tokens in topological order, every parent
before its children, siblings in draft-rank order):

    tokens    [N]     target-vocabulary ids
    parents   [N]     index of the parent node, -1 for the root
    depths    [N]     0 for the root, parent depth + 1 otherwise
    ancestors [N, N]  ancestors[i, j] is True iff j is i or an ancestor of i (the tree attention pattern)

A *sampled* tree (drafted for sampling, `TreeDrafter.grow_sampled`) also carries `sampled [N]` (the node's token
was drawn from its parent's draft distribution, not picked deterministically) and `draft_probs [N, V]` (each
node's draft distribution over the target vocabulary, which its sampled children were drawn from), which
`sample_accept` needs for recursive rejection sampling.

For the tree `0 -> {1, 2}`, `1 -> {3}`:

    parents = [-1, 0, 0, 1]      ancestors = 1 0 0 0
    depths  = [ 0, 1, 1, 2]                  1 1 0 0
                                             1 0 1 0
                                             1 1 0 1
"""

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A draft tree (see the module docstring for the layout).

    Args:
        tokens (`torch.LongTensor` of shape `(N,)`): node tokens, root first.
        parents (`torch.LongTensor` of shape `(N,)`): parent index per node, -1 for the root.
        depths (`torch.LongTensor` of shape `(N,)`): depth per node, 0 for the root.
        ancestors (`torch.BoolTensor` of shape `(N, N)`): `ancestors[i, j]` iff `j` is `i` or an ancestor of `i`.
        scores (`torch.FloatTensor` of shape `(N,)`): cumulative draft log-probability, 0 for the root.
        sampled (`torch.BoolTensor` of shape `(N,)`, *optional*): sampled trees only: True where the node's token
            was drawn (without replacement, in sibling order) from its parent's `draft_probs`.
        draft_probs (`torch.FloatTensor` of shape `(N, V)`, *optional*): sampled trees only: each node's draft
            distribution over the target vocabulary (rows of nodes without sampled children are unused).
    """

    tokens: torch.LongTensor
    parents: torch.LongTensor
    depths: torch.LongTensor
    ancestors: torch.BoolTensor
    scores: torch.FloatTensor
    sampled: torch.BoolTensor | None = None
    draft_probs: torch.FloatTensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> "DraftTree":
        fields = (self.tokens, self.parents, self.depths, self.ancestors, self.scores, self.sampled, self.draft_probs)
        return DraftTree(*(None if t is None else t.to(device) for t in fields))


def ancestor_matrix(parents: torch.LongTensor) -> tuple[torch.BoolTensor, torch.LongTensor]:
    """Ancestor matrix and depths from a topologically sorted parent vector, by pointer jumping.

    Loops over the tree height, never over nodes.

    Args:
        parents (`torch.LongTensor` of shape `(N,)`): parent index, -1 for the root (node 0).

    Returns:
        `(ancestors, depths)`: `(N, N)` bool with the diagonal set, and `(N,)` long.

    Example:
        >>> anc, depths = ancestor_matrix(torch.tensor([-1, 0, 0, 1]))
        >>> anc.int().tolist(), depths.tolist()
        ([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], [0, 1, 1, 2])
    """
    num_nodes = parents.shape[0]
    rows = torch.arange(num_nodes, device=parents.device)
    ancestors = torch.eye(num_nodes, dtype=torch.bool, device=parents.device)
    depths = torch.zeros(num_nodes, dtype=torch.long, device=parents.device)
    current = parents.clone()
    while bool((current >= 0).any()):
        valid = current >= 0
        ancestors[rows[valid], current[valid]] = True
        depths += valid.long()
        current = torch.where(valid, parents[current.clamp(min=0)], current)
    return ancestors, depths


def build_tree(
    root_token: torch.LongTensor,
    candidate_tokens: torch.LongTensor,
    candidate_scores: torch.FloatTensor,
    candidate_parents: torch.LongTensor,
    num_nodes: int,
) -> DraftTree:
    """EAGLE-2 rerank: keep the `num_nodes - 1` best candidates by cumulative log-probability, plus the root.

    Candidates are recorded level by level, so a parent always has a smaller flat index than its children. A
    child's score never exceeds its parent's (log-probabilities are <= 0), and a *stable* descending sort breaks
    ties by flat index, so the kept set always contains every kept node's ancestors. Kept nodes are ordered by
    flat index: topological, and siblings stay in draft-rank order.

    Args:
        root_token (`torch.LongTensor` of shape `()` or `(1,)`): the root (last chosen) token.
        candidate_tokens (`torch.LongTensor` of shape `(M,)`): target-vocabulary ids of all drafted candidates.
        candidate_scores (`torch.FloatTensor` of shape `(M,)`): cumulative draft log-probabilities.
        candidate_parents (`torch.LongTensor` of shape `(M,)`): flat index of each candidate's parent, -1 for
            children of the root.
        num_nodes (`int`): tree size including the root; at most `M + 1` nodes are kept.

    Returns:
        [`DraftTree`] with `min(num_nodes, M + 1)` nodes.
    """
    device = candidate_tokens.device
    keep = min(num_nodes - 1, candidate_tokens.shape[0])
    order = torch.sort(candidate_scores, descending=True, stable=True).indices[:keep]
    selected = torch.sort(order).values  # [keep] flat indices, topological order
    # flat candidate index -> node index (root is node 0)
    node_of = torch.full((candidate_tokens.shape[0],), -1, dtype=torch.long, device=device)
    node_of[selected] = torch.arange(1, keep + 1, device=device)
    flat_parents = candidate_parents[selected]
    parents = torch.where(flat_parents < 0, 0, node_of[flat_parents.clamp(min=0)])
    parents = torch.cat([torch.tensor([-1], device=device), parents])
    tokens = torch.cat([root_token.reshape(1).to(device), candidate_tokens[selected]])
    scores = torch.cat([torch.zeros(1, device=device, dtype=candidate_scores.dtype), candidate_scores[selected]])
    ancestors, depths = ancestor_matrix(parents)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, ancestors=ancestors, scores=scores)


def prune_tree(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop the nodes deeper than `max_depth` (e.g. when fewer tokens may still be generated than the tree is deep)."""
    keep = tree.depths <= max_depth
    if bool(keep.all()):
        return tree
    return _keep_nodes(tree, keep)


def _keep_nodes(tree: DraftTree, keep: torch.BoolTensor) -> DraftTree:
    """The subtree of the `keep` nodes `(N,)`, reindexed in order; `keep` must hold every kept node's ancestors."""
    index = torch.nonzero(keep).flatten()
    new_index = torch.cumsum(keep.long(), 0) - 1  # old node index -> new node index (valid where kept)
    parents = tree.parents[index]
    parents = torch.where(parents < 0, parents, new_index[parents.clamp(min=0)])
    return DraftTree(
        tokens=tree.tokens[index],
        parents=parents,
        depths=tree.depths[index],
        ancestors=tree.ancestors[index][:, index],
        scores=tree.scores[index],
        sampled=None if tree.sampled is None else tree.sampled[index],
        draft_probs=None if tree.draft_probs is None else tree.draft_probs[index],
    )


def tree_position_ids(tree: DraftTree, start: int) -> torch.LongTensor:
    """RoPE positions of the tree nodes, `(1, N)`: the root sits at `start`, a node at `start + depth`."""
    return (tree.depths + start).unsqueeze(0)


def tree_visibility(
    ancestors: torch.BoolTensor,
    depths: torch.LongTensor,
    num_past: int,
    past_offset: int,
    tree_offset: int,
    sliding_window: int | None = None,
    past_keep: torch.BoolTensor | None = None,
) -> torch.BoolTensor:
    """Which keys each tree node may attend to: every past key plus its own ancestors and itself.

    Key columns are `num_past` cached keys at absolute cache indices `past_offset .. past_offset + num_past - 1`,
    then the `N` tree nodes. Node `i` sits at absolute index `tree_offset + depths[i]`. With `sliding_window`, a
    key is visible only if it is less than `sliding_window` positions behind the query, as in Transformers'
    sliding-window layers (which keep `sliding_window - 1` past keys).

    Args:
        ancestors (`torch.BoolTensor` of shape `(N, N)`), depths (`torch.LongTensor` of shape `(N,)`): the tree.
        num_past (`int`): number of cached key columns in front of the tree.
        past_offset (`int`): absolute index of the first cached column.
        tree_offset (`int`): absolute index of the root.
        sliding_window (`int`, *optional*): window size of the layer, `None` for full attention.
        past_keep (`torch.BoolTensor` of shape `(num_past,)`, *optional*): False for padding columns.

    Returns:
        `torch.BoolTensor` of shape `(N, num_past + N)`.

    Example (window 3, two cached keys at indices 4 and 5, chain root -> 1 -> 2 at indices 6, 7, 8):
        >>> anc, d = ancestor_matrix(torch.tensor([-1, 0, 1]))
        >>> tree_visibility(anc, d, num_past=2, past_offset=4, tree_offset=6, sliding_window=3).int().tolist()
        [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    """
    num_nodes = depths.shape[0]
    device = depths.device
    past = torch.ones(num_nodes, num_past, dtype=torch.bool, device=device)
    if past_keep is not None:
        past = past & past_keep.to(device)[None, :]
    if sliding_window is not None:
        query_index = tree_offset + depths  # [N]
        past_index = past_offset + torch.arange(num_past, device=device)  # [num_past]
        past = past & (query_index[:, None] - past_index[None, :] < sliding_window)
        ancestors = ancestors & (depths[:, None] - depths[None, :] < sliding_window)
    return torch.cat([past, ancestors], dim=1)


def additive_mask(visible: torch.BoolTensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = visible) as a float additive mask: 0 where visible, the dtype's minimum elsewhere.

    Float, not bool: eager attention *adds* the mask, so a bool mask would be silently wrong there. A 2-D `(q, kv)`
    mask (a tree's) gains the batch and head axes attention takes, `(1, 1, q, kv)`; a 4-D `(batch, 1, q, kv)` mask
    (training-time test's) keeps its shape.
    """
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask = mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None] if mask.ndim == 2 else mask


def retrieve_paths(tree: DraftTree) -> torch.LongTensor:
    """Root-to-leaf paths, `(num_leaves, max_depth + 1)`, node indices padded with -1, leaves in node order.

    Example:
        >>> anc, depths = ancestor_matrix(torch.tensor([-1, 0, 0, 1]))
        >>> tree = DraftTree(torch.arange(4), torch.tensor([-1, 0, 0, 1]), depths, anc, torch.zeros(4))
        >>> retrieve_paths(tree).tolist()
        [[0, 2, -1], [0, 1, 3]]
    """
    num_nodes = tree.num_nodes
    is_parent = torch.zeros(num_nodes, dtype=torch.bool, device=tree.tokens.device)
    is_parent[tree.parents[tree.parents >= 0]] = True
    leaves = torch.nonzero(~is_parent).flatten()
    paths = torch.full((leaves.shape[0], int(tree.depths.max()) + 1), -1, dtype=torch.long, device=leaves.device)
    leaf_row, node = torch.nonzero(tree.ancestors[leaves], as_tuple=True)
    paths[leaf_row, tree.depths[node]] = node
    return paths


def path_to(tree: DraftTree, node: int) -> torch.LongTensor:
    """Node indices from the root to `node` (inclusive), `(depth + 1,)`; node order is depth order."""
    return torch.nonzero(tree.ancestors[node]).flatten()


def node_sequences(prefix: torch.LongTensor, tree: DraftTree, depth: int) -> tuple[torch.LongTensor, torch.Tensor]:
    """The token sequence each node at `depth` continues: the prefix (which ends with the root) plus its path.

    Args:
        prefix (`torch.LongTensor` of shape `(1, L)`): the sequence so far; its last token is the root.
        tree ([`DraftTree`]): the tree.
        depth (`int`): which level.

    Returns:
        `(nodes, sequences)`: node indices `(n,)` at that depth and their sequences `(n, L + depth)`.
    """
    nodes = torch.nonzero(tree.depths == depth).flatten()
    path_tokens = torch.empty(nodes.shape[0], depth, dtype=tree.tokens.dtype, device=tree.tokens.device)
    if depth > 0:
        rows, cols = torch.nonzero(tree.ancestors[nodes], as_tuple=True)
        not_root = tree.depths[cols] > 0
        path_tokens[rows[not_root], tree.depths[cols[not_root]] - 1] = tree.tokens[cols[not_root]]
    sequences = torch.cat([prefix.expand(nodes.shape[0], -1), path_tokens.to(prefix.device)], dim=1)
    return nodes, sequences


def greedy_accept(tree: DraftTree, choices: torch.LongTensor) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Longest path whose every draft token equals the target's choice at its parent.

    Siblings carry distinct tokens, so at most one child of a node can match: the accepted path is unique.

    Args:
        tree ([`DraftTree`]): the verified tree.
        choices (`torch.LongTensor` of shape `(N,)`): the target's (processed) argmax at every node.

    Returns:
        `(path, bonus)`: accepted node indices root first `(acc + 1,)`, and the bonus token `()` (the target's
        choice at the last accepted node).

    Example (the target picks 7 after the root and 9 after node 1; node 2 is wrong, node 3 right):
        >>> anc, depths = ancestor_matrix(torch.tensor([-1, 0, 0, 1]))
        >>> tree = DraftTree(torch.tensor([5, 7, 8, 9]), torch.tensor([-1, 0, 0, 1]), depths, anc, torch.zeros(4))
        >>> path, bonus = greedy_accept(tree, torch.tensor([7, 9, 1, 4]))
        >>> path.tolist(), bonus.item()
        ([0, 1, 3], 4)
    """
    correct = torch.ones_like(tree.tokens, dtype=torch.bool)
    correct[1:] = tree.tokens[1:] == choices[tree.parents[1:]]
    accepted = ~(tree.ancestors & ~correct[None, :]).any(dim=1)  # every node on the path is correct
    best = torch.argmax(torch.where(accepted, tree.depths, -1))
    return path_to(tree, int(best)), choices[best]


def sample_accept(tree: DraftTree, probs: torch.Tensor) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Lossless speculative sampling over a tree: recursive rejection sampling, child by child.

    From the current node, with `r` the target's (processed) distribution there, the children are tried in node
    order:

    - a *deterministic* child `c` (top-k or prompt-lookup, i.e. `q = δ_c`) is accepted with probability `r(c)`;
      on rejection `r(c)` is zeroed and `r` renormalised (the SpecInfer / EAGLE rule with `q(x) = 1`);
    - a *sampled* child `x` (`tree.sampled`), drawn from the parent's draft distribution `q` without replacement,
      is accepted with probability `min(1, r(x) / q(x))`; on rejection `r <- norm(max(r - q, 0))` and `x` is
      removed from `q`, which is renormalised: the distribution the next sampled sibling was drawn from
      (recursive speculative decoding without replacement, Jeon et al. 2024, arXiv 2402.14160).

    Each step is one exact speculative-sampling step for the current `r`, so if every child is rejected the bonus
    token drawn from the residual `r` (at a leaf, from the leaf's distribution) completes an exact sample: every
    emitted token is distributed as the target's processed next-token distribution given the accepted prefix.

    Args:
        tree ([`DraftTree`]): the verified tree.
        probs (`torch.FloatTensor` of shape `(N, V)`): the target's processed next-token distribution per node.

    Returns:
        `(path, bonus)`: accepted node indices root first `(acc + 1,)`, and the bonus token `()`.
    """
    tokens = tree.tokens.tolist()
    sampled = [False] * len(tokens) if tree.sampled is None else tree.sampled.tolist()
    children_of: list[list[int]] = [[] for _ in tokens]
    for child, parent in enumerate(tree.parents.tolist()[1:], start=1):
        children_of[parent].append(child)  # node order = draft order among siblings
    node, path = 0, [0]
    while True:
        residual = probs[node].double()
        residual = residual / residual.sum()
        draft = None
        accepted = None
        for child in children_of[node]:
            token, u = tokens[child], float(torch.rand((), dtype=torch.float64))
            if sampled[child]:
                if draft is None:  # a copy even when already float64: rejections edit it in place below
                    draft = tree.draft_probs[node].to(torch.float64, copy=True)
                if u * float(draft[token]) < float(residual[token]):  # u < min(1, r(x) / q(x))
                    accepted = child
                    break
                left = torch.clamp(residual - draft, min=0)
                draft[token] = 0
                draft = draft / draft.sum()
            else:
                if u < float(residual[token]):
                    accepted = child
                    break
                left = residual.clone()
                left[token] = 0
            # Nothing left happens only through rounding (a child holding all of `r` is always accepted).
            residual = left / left.sum() if bool(left.sum() > 0) else residual
        if accepted is None:
            return torch.tensor(path, device=tree.tokens.device), torch.multinomial(residual.float(), 1)[0]
        node = accepted
        path.append(node)


def append_chain(tree: DraftTree, chain: torch.LongTensor) -> DraftTree:
    """Add the path `root -> chain[0] -> chain[1] -> ...` to a sampled tree as new deterministic nodes.

    Unlike `graft_chain`, nothing is merged or dropped: which sampled nodes a tree keeps must not depend on their
    own tokens, or the sampled siblings would no longer follow the draft distribution that `sample_accept`
    assumes. The caller leaves room for the chain when growing the tree. A chain token may equal a sampled
    sibling's; recursive rejection sampling handles the duplicate.

    Args:
        tree ([`DraftTree`]): a tree with `sampled` and `draft_probs`.
        chain (`torch.LongTensor` of shape `(m,)`): tokens expected after the root.

    Returns:
        [`DraftTree`] with `tree.num_nodes + m` nodes.
    """
    return tree if chain.numel() == 0 else _add_path(tree, 0, chain)


def _add_path(tree: DraftTree, graft_point: int, tokens: torch.LongTensor) -> DraftTree:
    """`tree` plus the new path `graft_point -> tokens[0] -> tokens[1] -> ...` `(m,)`, appended after its nodes
    (topological order holds). The new nodes are deterministic: score 0, not sampled, no draft distribution."""
    m, device = tokens.numel(), tree.tokens.device
    chain_parents = torch.arange(tree.num_nodes - 1, tree.num_nodes - 1 + m, device=device)
    chain_parents[0] = graft_point
    parents = torch.cat([tree.parents, chain_parents])
    ancestors, depths = ancestor_matrix(parents)
    sampled, draft_probs = tree.sampled, tree.draft_probs
    return DraftTree(
        tokens=torch.cat([tree.tokens, tokens.to(device)]),
        parents=parents,
        depths=depths,
        ancestors=ancestors,
        scores=torch.cat([tree.scores, tree.scores.new_zeros(m)]),
        sampled=None if sampled is None else torch.cat([sampled, sampled.new_zeros(m)]),
        draft_probs=None
        if draft_probs is None
        else torch.cat([draft_probs, draft_probs.new_zeros(m, draft_probs.shape[1])]),
    )


def graft_chain(tree: DraftTree, chain: torch.LongTensor) -> DraftTree:
    """Add the path `root -> chain[0] -> chain[1] -> ...` to `tree`, keeping its node count.

    The chain follows existing nodes as long as their tokens agree, then continues with new nodes appended after the
    others (topological order holds; siblings stay distinct, as `sample_accept` needs). Room is made by dropping as
    many of the lowest-scoring draft nodes off the chain, children before parents (a child never scores above its
    parent, and ties drop the later node first), so what is left is still a tree and verification keeps its row
    count. A chain longer than the droppable nodes is cut. New nodes score 0: they do not come from the head.

    Args:
        tree ([`DraftTree`]): the draft tree.
        chain (`torch.LongTensor` of shape `(m,)`): tokens expected after the root, e.g. `prompt_lookup_chain`.

    Returns:
        [`DraftTree`] with `tree.num_nodes` nodes.
    """
    if tree.sampled is not None:
        raise ValueError("graft_chain would drop sampled nodes by their scores; use append_chain for sampled trees.")
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    node, on_chain = 0, {0}
    for token in chain.tolist():
        child = next((c for c in range(1, len(parents)) if parents[c] == node and tokens[c] == token), None)
        if child is None:
            break
        node = child
        on_chain.add(node)
    droppable = [i for i in range(1, len(parents)) if i not in on_chain]
    new_tokens = chain[len(on_chain) - 1 :][: len(droppable)]
    if new_tokens.numel() == 0:
        return tree
    scores = tree.scores.tolist()
    droppable.sort(key=lambda i: (scores[i], -i))
    keep = torch.ones(len(parents), dtype=torch.bool, device=tree.tokens.device)
    keep[droppable[: new_tokens.numel()]] = False
    kept = _keep_nodes(tree, keep)
    return _add_path(kept, int(keep[:node].sum()), new_tokens)  # `node`'s index among the kept nodes
