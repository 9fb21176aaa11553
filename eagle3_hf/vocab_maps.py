"""The draft vocabulary maps `d2t` / `t2d` of an EAGLE-3 head (pure functions).

`d2t` (int64 `[V_d]`) holds offsets: draft id `i` is target id `i + d2t[i]`. `t2d` (bool `[V]`) marks the target
ids that are in the draft vocabulary. The draft vocabulary is sorted ascending, so `logits[..., t2d]` comes out in
draft-id order. The head (`Eagle3DraftModel.set_vocab_maps`), the checkpoint readers and the vocabulary builder
(`eagle3_hf.training.vocab`) all check and build maps with these.
"""

import torch


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Rebuild `t2d` (bool `[vocab_size]`) from `d2t` (int64 `[V_d]`)."""
    target_ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t
    if target_ids.numel() and (target_ids.min() < 0 or target_ids.max() >= vocab_size):
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {vocab_size}).")
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=d2t.device)
    t2d[target_ids] = True
    return t2d


def maps_from_token_ids(token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(d2t, t2d)` for a draft vocabulary made of the given target ids (any order, no duplicates)."""
    ids = torch.sort(token_ids.to(torch.long).unique()).values
    if ids.numel() != token_ids.numel():
        raise ValueError("token_ids contains duplicates.")
    d2t = ids - torch.arange(ids.shape[0])
    return d2t, t2d_from_d2t(d2t, vocab_size)


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab_size: int, vocab_size: int) -> None:
    """Raise `ValueError` naming the problem when `d2t`/`t2d` are inconsistent with the config or each other."""
    if d2t.ndim != 1 or d2t.shape[0] != draft_vocab_size:
        raise ValueError(f"d2t has shape {tuple(d2t.shape)}; expected ({draft_vocab_size},) = (draft_vocab_size,).")
    if t2d.ndim != 1 or t2d.shape[0] != vocab_size:
        raise ValueError(f"t2d has shape {tuple(t2d.shape)}; expected ({vocab_size},) = (vocab_size,).")
    if int(t2d.sum()) != draft_vocab_size:
        raise ValueError(f"t2d marks {int(t2d.sum())} target ids but draft_vocab_size={draft_vocab_size}.")
    target_ids = torch.arange(draft_vocab_size, device=d2t.device) + d2t
    if draft_vocab_size > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        raise ValueError("d2t does not map draft ids to strictly increasing target ids (the vocab must be sorted).")
    if target_ids.min() < 0 or target_ids.max() >= vocab_size:
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {vocab_size}).")
    if not bool(t2d[target_ids.to(t2d.device)].all()):
        raise ValueError("t2d disagrees with d2t: some target ids reached through d2t are not marked in t2d.")


__all__ = ["check_vocab_maps", "maps_from_token_ids", "t2d_from_d2t"]
