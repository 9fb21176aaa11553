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
from .tree import DraftTree, additive_mask, build_tree


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
        k = self.top_k
        stable = self.stable_length - k * (level - 1)  # the cache also holds k entries per level fed so far
        device, dtype = self.draft.fc.weight.device, self.draft.fc.weight.dtype
        past = torch.ones(k, stable, dtype=torch.bool, device=device)
        if self.past_keep is not None:
            past = past & self.past_keep[None, :]
        out = self.draft(
            input_ids=frontier.tokens[None],
            hidden_states=frontier.hidden[None],
            attention_mask=additive_mask(torch.cat([past, frontier.visible], dim=1), dtype),
            position_ids=torch.full((1, k), stable - 1 + level, device=device),
            cache=self.cache,
            use_cache=True,
        )
        values, ids = torch.log_softmax(out.logits[0].float(), dim=-1).topk(k, dim=-1)  # [k, k]
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
            hidden=out.hidden_states[0][parent_slot],
            visible=torch.cat([frontier.visible[parent_slot], eye], dim=1),
        )


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
