"""Grow EAGLE-2 dynamic draft trees with an EAGLE-3 draft head.

The drafter owns the head's *stable* KV cache: one entry per `(token, target feature)` pair of the accepted
sequence, at draft position = target position - 1 (the pair `(x[j + 1], F[j])` sits at draft position `j`).
Tree nodes are fed with the head's own pre-norm outputs; their KV entries are temporary and cropped away as soon
as the tree is built, so the next round re-encodes the accepted tokens with the *target's* features.
"""

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from ..modeling_eagle3 import Eagle3DraftModel
from .cuda_attention import speculative_attention_kernels
from .tree import DraftTree, additive_mask, ancestor_matrix, build_tree


class TreeDrafter:
    """Runs an [`Eagle3DraftModel`] to grow one draft tree per decoding round.

    Args:
        draft ([`Eagle3DraftModel`]): the head, on the device and dtype it should run in, with an embedding.
        top_k (`int`): children proposed per expanded node, and nodes expanded per level.
    """

    def __init__(self, draft: Eagle3DraftModel, top_k: int):
        self.draft = draft
        self.top_k = min(top_k, draft.config.draft_vocab_size)
        self.cache = DynamicCache(config=draft.config)
        self.past_keep: torch.BoolTensor | None = None  # [stable_length]; None while there is no padding
        self._last_hidden: torch.Tensor | None = None  # [hidden_size], output at the newest stable entry
        self._last_logits: torch.Tensor | None = None  # [draft_vocab_size]

    @property
    def stable_length(self) -> int:
        return self.cache.get_seq_length()

    def extend(self, tokens: torch.LongTensor, features: torch.Tensor, keep: torch.BoolTensor | None = None) -> None:
        """Encode new accepted pairs into the stable cache.

        Args:
            tokens (`torch.LongTensor` of shape `(1, T)`): the tokens `x[j + 1]` (target vocabulary).
            features (`torch.Tensor` of shape `(1, T, num_target_features)`): the target features `F[j]`.
            keep (`torch.BoolTensor` of shape `(T,)`, *optional*): False where `F[j]` belongs to a padding token.
        """
        device = self.draft.fc.weight.device
        past, num_new = self.stable_length, tokens.shape[1]
        if keep is not None and not bool(keep.all()) and self.past_keep is None:
            self.past_keep = torch.ones(past, dtype=torch.bool, device=device)
        attention_mask = None
        if self.past_keep is not None:
            keep = torch.ones(num_new, dtype=torch.bool, device=device) if keep is None else keep.to(device)
            self.past_keep = torch.cat([self.past_keep, keep])
            attention_mask = self.past_keep.long()[None]
        with speculative_attention_kernels(device):
            out = self.draft(
                input_ids=tokens.to(device),
                target_hidden_states=features.to(device),
                attention_mask=attention_mask,
                position_ids=torch.arange(past, past + num_new, device=device)[None],
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self._last_hidden = out.hidden_states[0, -1]
        self._last_logits = out.logits[0, -1]

    def root_confidence(self, temperature: float = 1.0) -> float:
        """The head's largest probability for the token after the next root (`softmax(logits / temperature)`),
        from the last `extend`: what the next tree's first level is drawn from, and how sure the head is of it."""
        return float(torch.softmax(self._last_logits.float() / temperature, dim=-1).max())

    def grow(self, root_token: torch.LongTensor, depth: int, num_nodes: int) -> DraftTree:
        """Expand the tree level by level from the newest stable entry, then rerank.

        Level 1 is the `top_k` best tokens of the root's distribution. Each further level feeds the `top_k`
        frontier nodes (all at draft position `stable_length - 1 + level`, each attending to the stable cache, its
        ancestors and itself), records all `top_k**2` children with cumulative log-probabilities, and keeps the
        best `top_k` as the next frontier. Drafting uses no temperature (EAGLE-2).

        Args:
            root_token (`torch.LongTensor` of shape `()`): the last chosen token (the tree root).
            depth (`int`): number of levels below the root (0 gives a root-only tree).
            num_nodes (`int`): tree size including the root; at most `1 + top_k + (depth - 1) * top_k**2`.

        Returns:
            [`DraftTree`] on the head's device.
        """
        k, device = self.top_k, self.draft.fc.weight.device
        if depth == 0:
            empty = torch.empty(0, dtype=torch.long, device=device)
            return build_tree(root_token.to(device), empty, empty.float(), empty, num_nodes)
        values, ids = torch.log_softmax(self._last_logits.float(), dim=-1).topk(k)
        tokens = self.draft.draft_to_target_ids(ids)
        candidates = ([tokens], [values], [torch.full((k,), -1, dtype=torch.long, device=device)])
        frontier = _Frontier(
            tokens=tokens,
            scores=values,
            flat_index=torch.arange(k, device=device),
            hidden=self._last_hidden.expand(k, -1),  # level-1 nodes' parent is the root
            visible=torch.eye(k, dtype=torch.bool, device=device),
        )
        for level in range(1, depth):
            frontier = self._expand(frontier, level, candidates, last=level == depth - 1)
        self.cache.crop(-k * (depth - 1))  # drop the temporary tree-node entries
        return build_tree(root_token.to(device), *(torch.cat(c) for c in candidates), num_nodes)

    def _expand(self, frontier: "_Frontier", level: int, candidates: tuple, last: bool) -> "_Frontier":
        """Feed the frontier (level `level`), record its children, return the next frontier."""
        k, device = self.top_k, self.draft.fc.weight.device
        # the cache also holds k temporary entries per level fed so far
        hidden, logits = self._feed(frontier.tokens, frontier.hidden, frontier.visible, level, k * (level - 1))
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)  # [k, k]
        child_scores = (frontier.scores[:, None] + values).flatten()  # [k * k]
        child_tokens = self.draft.draft_to_target_ids(ids).flatten()
        offset = sum(c.shape[0] for c in candidates[0])
        candidates[0].append(child_tokens)
        candidates[1].append(child_scores)
        candidates[2].append(frontier.flat_index.repeat_interleave(k))
        if last:
            return frontier
        best = child_scores.topk(k).indices
        parent_slot = best // k
        eye = torch.eye(k, dtype=torch.bool, device=device)
        return _Frontier(
            tokens=child_tokens[best],
            scores=child_scores[best],
            flat_index=offset + best,
            hidden=hidden[parent_slot],
            visible=torch.cat([frontier.visible[parent_slot], eye], dim=1),
        )

    def grow_sampled(self, root_token: torch.LongTensor, depth: int, num_nodes: int, temperature: float) -> DraftTree:
        """A tree for sampling: children *drawn* from the head's distribution, so that sampled verification
        accepts `min(1, p / q)` of them instead of only the target probability of a fixed top-k (measured on
        SmolLM2-135M at temperature 1: 0.57 against 0.40 accepted at the root with 4 children).

        Every expanded node draws `top_k` children without replacement from `q = softmax(logits / temperature)`
        (Gumbel top-k, kept in draw order). Which of them the tree keeps must not depend on their own tokens (or
        they would no longer follow `q`), so the `num_nodes - 1` nodes are split over the levels in advance
        (`level_budgets`: one per level, the spare halved per level; 7 nodes over 3 levels are 3 + 2 + 2), and
        level `l` keeps the children with the best *slot* scores: the parent's cumulative log-probability plus the
        log of the `j`-th largest probability of the parent's `q`, for the parent's `j`-th draw. A parent
        therefore always keeps a prefix of its draws. The best `top_k` kept nodes of a level (by their own cumulative
        log-probability, which only decides their children) are expanded next.

        Args:
            root_token (`torch.LongTensor` of shape `()`): the last chosen token (the tree root).
            depth (`int`): number of levels below the root.
            num_nodes (`int`): tree size including the root.
            temperature (`float`): the sampling temperature; the head's logits are divided by it.

        Returns:
            [`DraftTree`] on the head's device, with `sampled` and `draft_probs` (target vocabulary).
        """
        k, device = self.top_k, self.draft.fc.weight.device
        vocab_size = self.draft.config.vocab_size
        target_ids = self.draft.draft_to_target_ids(torch.arange(self.draft.config.draft_vocab_size, device=device))
        budgets = level_budgets(num_nodes - 1, depth)
        tokens, scores = [root_token.reshape(1).to(device)], [torch.zeros(1, device=device)]
        parents = [torch.full((1,), -1, dtype=torch.long, device=device)]
        node_probs = []  # (node indices, their draft distributions over the target vocabulary), per fed batch
        fed_node = torch.zeros(1, dtype=torch.long, device=device)  # tree node of each fed row; the root first
        fed_scores, logits, hidden = torch.zeros(1, device=device), self._last_logits[None], self._last_hidden[None]
        visible = torch.ones(1, 0, dtype=torch.bool, device=device)  # fed rows x temporary cache entries
        num_fed, num_kept = 0, 1
        for level, budget in enumerate(budgets, start=1):
            log_q = torch.log_softmax(logits.float() / temperature, dim=-1)  # [F, Vd]
            q = torch.zeros(log_q.shape[0], vocab_size, device=device)
            node_probs.append((fed_node, q.index_copy_(1, target_ids, log_q.exp())))
            gumbel = -torch.log(-torch.log(torch.rand_like(log_q).clamp_(min=1e-20)))
            draws = (log_q + gumbel).topk(k, dim=-1).indices  # [F, k]: k draws without replacement, in draw order
            slot_scores = fed_scores[:, None] + log_q.topk(k, dim=-1).values  # [F, k]: do not depend on the draws
            slot_scores = slot_scores.masked_fill(~torch.isfinite(log_q.gather(1, draws)), float("-inf"))
            flat = torch.sort(slot_scores.flatten(), descending=True, stable=True).indices[:budget]
            flat = torch.sort(flat[torch.isfinite(slot_scores.flatten()[flat])]).values  # parent by parent
            if flat.numel() == 0:
                break
            row, draw = flat // k, flat % k
            new_tokens = target_ids[draws[row, draw]]
            new_scores = fed_scores[row] + log_q[row, draws[row, draw]]
            tokens.append(new_tokens)
            scores.append(new_scores)
            parents.append(fed_node[row])
            first, num_kept = num_kept, num_kept + flat.numel()
            if level == len(budgets):
                break
            expand = torch.sort(new_scores.topk(min(k, flat.numel())).indices).values  # kept nodes fed next
            parent_rows = row[expand]
            eye = torch.eye(expand.numel(), dtype=torch.bool, device=device)
            visible = torch.cat([visible[parent_rows], eye], dim=1)
            hidden, logits = self._feed(new_tokens[expand], hidden[parent_rows], visible, level, num_fed)
            num_fed += expand.numel()
            fed_node, fed_scores = first + expand, new_scores[expand]
        if num_fed:
            self.cache.crop(-num_fed)  # drop the temporary tree-node entries
        all_parents = torch.cat(parents)
        ancestors, depths = ancestor_matrix(all_parents)
        draft_probs = torch.zeros(num_kept, vocab_size, device=device)
        for nodes, q in node_probs:
            draft_probs[nodes] = q
        sampled = torch.ones(num_kept, dtype=torch.bool, device=device)
        sampled[0] = False
        return DraftTree(torch.cat(tokens), all_parents, depths, ancestors, torch.cat(scores), sampled, draft_probs)

    def _feed(
        self, tokens: torch.LongTensor, hidden: torch.Tensor, visible: torch.BoolTensor, level: int, num_fed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on `F` tree nodes of level `level` (after `num_fed` temporary entries); returns their
        pre-norm outputs `(F, H)` and logits `(F, draft_vocab_size)`. `hidden` `(F, H)` are their parents' outputs,
        `visible` `(F, num_fed + F)` their ancestors (and themselves) among the temporary entries."""
        device, dtype = self.draft.fc.weight.device, self.draft.fc.weight.dtype
        stable = self.stable_length - num_fed
        past = torch.ones(tokens.shape[0], stable, dtype=torch.bool, device=device)
        if self.past_keep is not None:
            past = past & self.past_keep[None, :]
        with speculative_attention_kernels(device):
            out = self.draft(
                input_ids=tokens[None],
                hidden_states=hidden[None],
                attention_mask=additive_mask(torch.cat([past, visible], dim=1), dtype),
                position_ids=torch.full((1, tokens.shape[0]), stable - 1 + level, device=device),
                cache=self.cache,
                use_cache=True,
            )
        return out.hidden_states[0], out.logits[0]


@dataclass
class _Frontier:
    """The `k` nodes fed at the next level.

    tokens `(k,)`, cumulative scores `(k,)`, flat candidate indices `(k,)`, the parents' pre-norm outputs `(k, H)`
    (fed as hidden states), and visibility `(k, k * level)` over the temporary tree entries (ancestors and self).
    """

    tokens: torch.LongTensor
    scores: torch.FloatTensor
    flat_index: torch.LongTensor
    hidden: torch.Tensor
    visible: torch.BoolTensor


def level_budgets(num_drawn: int, depth: int) -> list[int]:
    """How many drawn nodes each of a sampled tree's `depth` levels keeps (`TreeDrafter.grow_sampled`).

    Every level gets one node first, as far as they go; the spare nodes are halved level by level and the last
    level takes the rest (6 nodes over 4 levels are 2 + 2 + 1 + 1, 7 over 3 are 3 + 2 + 2, 11 over 4 are
    5 + 3 + 2 + 1). Plain halving (6 over 4: 3 + 2 + 1 + 0) left the deepest levels empty whenever a prompt-lookup
    chain took half the tree; this split accepts more (tau at temperature 1 +7% on HumanEval, session 39). The
    budgets are fixed before any draw, so which children a level keeps cannot depend on their own tokens.
    """
    budgets, left = [], num_drawn
    for level in range(depth):
        if level == depth - 1:
            take = left
        else:
            spare = max(0, left - (depth - level))
            take = min(left, 1 + (spare + 1) // 2)
        budgets.append(take)
        left -= take
    return budgets
