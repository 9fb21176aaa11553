"""Training-time test (TTT) for EAGLE-3 as pure tensor functions: step alignment, the per-step attention mask, the
soft-label loss restricted to the draft vocabulary, accuracy and a simulated acceptance length.

`Eagle3Trainer.compute_loss` unrolls `K` draft steps (default 7) over a batch with these functions. Notation:
`x` token ids `[B, T]`, `F = fc(target features)`, `P` target logits `[B, T, V]`, `g_k` the draft's pre-norm
output of step `k`. At step `k` and index `t`:

| quantity            | value                                                     | function                   |
|---------------------|-----------------------------------------------------------|----------------------------|
| input token         | `x[t + 1 + k]` (teacher forced)                           | `shift_left(x, 1 + k)`     |
| input hidden        | `F[t]` at `k = 0`, else `g_{k-1}[t]`                      | (the trainer's unroll)     |
| target distribution | `P[t + 1 + k]`, the target's prediction of `x[t + 2 + k]` | `soft_targets`, `step_targets` |
| loss mask           | `loss_mask[t + 2 + k] * t2d[argmax P[t + 1 + k]]`         | `step_targets`             |
| RoPE position       | `t + k`                                                   | (the trainer's unroll)     |
| attention           | step-0 keys `t' <= t`, plus key `(t, j)` for `j = 1..k`   | `ttt_attention_mask`       |

**Loss-mask alignment.** The reference code shifts its loss mask by `k` (`loss_mask[t + k]`) because its mask is
built with Llama-3-specific offsets. Our `loss_mask[i]` marks token `i` itself (1 iff token `i` is an assistant
token to learn), and the token predicted at step `k`, index `t` is `x[t + 2 + k]`, so we read
`loss_mask[t + 2 + k]`. Everything shifted past the end of the sequence is zero, hence masked.

Reference: EAGLE-3, arXiv 2503.01840 (https://huggingface.co/papers/2503.01840), and `SafeAILab/EAGLE`
`eagle/traineagle3/cnets.py`.
"""

import torch
import torch.nn.functional as F


def shift_left(tensor: torch.Tensor, shift: int) -> torch.Tensor:
    """`out[:, t] = tensor[:, t + shift]`, zero-filled where `t + shift >= T`.

    Args:
        tensor (`torch.Tensor` of shape `(batch, seq, ...)`): any per-position tensor.
        shift (`int`): non-negative shift.

    Returns:
        A tensor of the same shape and dtype.

    Example:
        >>> shift_left(torch.tensor([[1, 2, 3, 4]]), 2)
        tensor([[3, 4, 0, 0]])
    """
    if shift < 0:
        raise ValueError(f"shift={shift} must be >= 0.")
    if shift == 0:
        return tensor
    out = torch.zeros_like(tensor)
    if shift < tensor.shape[1]:
        out[:, : tensor.shape[1] - shift] = tensor[:, shift:]
    return out


def step_loss_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """The loss mask of TTT step `step`: `loss_mask[t + 2 + step]` (see the module docstring for why `+2`).

    Args:
        loss_mask (`torch.Tensor` of shape `(batch, seq)`): 1 iff token `i` is an assistant token to learn.

    Returns:
        `torch.BoolTensor` of shape `(batch, seq)`.
    """
    return shift_left(loss_mask.bool(), 2 + step)


def ttt_attention_mask(attention_mask: torch.Tensor, step: int, sliding_window: int | None = None) -> torch.BoolTensor:
    """Boolean attention mask of TTT step `step` against the keys of steps `0..step` (True = visible).

    Query `(t, step)` sees the step-0 keys `t' <= t` that are not padding, plus the key at the **same** index `t` of
    every step `j = 1..step` (its own key included). Example, `T = 3`, `step = 2`, no padding::

        query t | step-0 keys 0 1 2 | step-1 keys 0 1 2 | step-2 keys 0 1 2
           0    |             1 0 0 |             1 0 0 |             1 0 0
           1    |             1 1 0 |             0 1 0 |             0 1 0
           2    |             1 1 1 |             0 0 1 |             0 0 1

    A query always sees its own step-0 key, even at a padding index, so that no row is fully masked (padding
    rows carry no loss; a fully masked row would give NaN under SDPA).

    Args:
        attention_mask (`torch.Tensor` of shape `(batch, seq)`): 1 for real tokens, 0 for padding.
        step (`int`): the TTT step `k >= 0`.
        sliding_window (`int`, *optional*): for sliding-window head layers, the step-0 keys are further limited to
            `t' > t - sliding_window` (as speculators trains them); the own chain is always visible.

    Returns:
        `torch.BoolTensor` of shape `(batch, 1, seq, (step + 1) * seq)`, columns ordered step by step as the draft's
        `DynamicCache` holds them.
    """
    batch, seq = attention_mask.shape
    index = torch.arange(seq, device=attention_mask.device)
    causal = index[None, :] <= index[:, None]  # shape: [T(query), T(key)]
    diagonal = index[None, :] == index[:, None]  # shape: [T, T]
    keys_real = attention_mask.bool()[:, None, :]  # shape: [B, 1, T(key)]
    if sliding_window is not None:
        causal = causal & (index[None, :] > index[:, None] - sliding_window)
    first = causal[None] & (keys_real | diagonal[None])  # shape: [B, T, T]
    blocks = [first] + [diagonal[None].expand(batch, seq, seq)] * step
    return torch.cat(blocks, dim=-1)[:, None]  # shape: [B, 1, T, (step + 1) * T]


def soft_targets(
    target_logits: torch.Tensor, t2d: torch.BoolTensor, hard: bool = False
) -> tuple[torch.Tensor, torch.BoolTensor]:
    """Target distribution restricted to the draft vocabulary, and where the target's top-1 lies inside it.

    Args:
        target_logits (`torch.Tensor` of shape `(batch, seq, vocab_size)`): target logits `P`.
        t2d (`torch.BoolTensor` of shape `(vocab_size,)`): draft-vocabulary membership of each target id.
        hard (`bool`, *optional*, defaults to `False`): one-hot labels on the target's top-1 token instead of its
            distribution (the loss becomes plain cross-entropy; an ablation, `--hard_labels`). Where that token is
            outside the draft vocabulary the position is masked either way (`in_draft_vocab`).

    Returns:
        probs (`torch.FloatTensor` of shape `(batch, seq, draft_vocab_size)`): `softmax(P[..., t2d])` in fp32,
            in draft-id order (the draft vocabulary is sorted); with `hard`, its one-hot argmax.
        in_draft_vocab (`torch.BoolTensor` of shape `(batch, seq)`): `t2d[argmax_V P]`.
    """
    t2d = t2d.to(target_logits.device)
    probs = torch.softmax(target_logits[..., t2d].float(), dim=-1)
    if hard:
        probs = F.one_hot(probs.argmax(dim=-1), probs.shape[-1]).float()
    in_draft_vocab = t2d[target_logits.argmax(dim=-1)]
    return probs, in_draft_vocab


def step_targets(
    probs: torch.Tensor, in_draft_vocab: torch.BoolTensor, loss_mask: torch.Tensor, step: int
) -> tuple[torch.Tensor, torch.BoolTensor]:
    """Targets of TTT step `step`: `p_k = probs[t + 1 + k]` and `position_mask = in_draft_vocab[t + 1 + k] *
    loss_mask[t + 2 + k]`.

    Args:
        probs (`torch.FloatTensor` of shape `(batch, seq, draft_vocab_size)`): from `soft_targets`.
        in_draft_vocab (`torch.BoolTensor` of shape `(batch, seq)`): from `soft_targets`.
        loss_mask (`torch.Tensor` of shape `(batch, seq)`): 1 iff token `i` is an assistant token to learn.

    Returns:
        `(p_k, position_mask)` of shapes `(batch, seq, draft_vocab_size)` and `(batch, seq)`.
    """
    position_mask = shift_left(in_draft_vocab, 1 + step) & step_loss_mask(loss_mask, step)
    return shift_left(probs, 1 + step), position_mask


def soft_label_loss_per_sample(
    draft_logits: torch.Tensor, target_probs: torch.Tensor, position_mask: torch.BoolTensor
) -> torch.Tensor:
    """Soft-label cross-entropy of one step, per sample, averaged over **all** `T` positions (not the masked count).

    `loss[b] = -(1/T) sum_t position_mask[b, t] * sum_v p[b, t, v] * log_softmax(draft_logits)[b, t, v]`, in fp32.
    Its mean over the batch is the reference's `loss_k` (`1/(B*T)` over the whole batch).

    Args:
        draft_logits (`torch.Tensor` of shape `(batch, seq, draft_vocab_size)`).
        target_probs (`torch.FloatTensor` of shape `(batch, seq, draft_vocab_size)`).
        position_mask (`torch.BoolTensor` of shape `(batch, seq)`).

    Returns:
        `torch.FloatTensor` of shape `(batch,)`.
    """
    log_probs = F.log_softmax(draft_logits.float(), dim=-1)
    per_position = -(target_probs * log_probs).sum(dim=-1)  # shape: [B, T]
    return (per_position * position_mask).sum(dim=-1) / draft_logits.shape[1]


def soft_label_loss(
    draft_logits: torch.Tensor, target_probs: torch.Tensor, position_mask: torch.BoolTensor
) -> torch.Tensor:
    """The reference `loss_k`: `soft_label_loss_per_sample(...).mean()`, i.e. averaged over `B * T` positions."""
    return soft_label_loss_per_sample(draft_logits, target_probs, position_mask).mean()


def step_correct(
    draft_logits: torch.Tensor, target_probs: torch.Tensor, position_mask: torch.BoolTensor
) -> torch.Tensor:
    """Where the draft's top-1 equals the (restricted) target's top-1 at a counted position.

    Returns `torch.BoolTensor` of shape `(batch, seq)`. The reference accuracy of step `k` is
    `step_correct(...).sum() / step_loss_mask(loss_mask, k).sum()`: positions whose target top-1 is outside the draft
    vocabulary count as misses.
    """
    return (draft_logits.argmax(dim=-1) == target_probs.argmax(dim=-1)) & position_mask


def chain_acceptance_lengths(correct: torch.Tensor) -> torch.Tensor:
    """Simulated acceptance length per position for a greedy **chain** of `K` drafted tokens.

    Under TTT, the `K` steps at index `t` form one chain rooted at `t` (step `k` drafts `x[t + 2 + k]`), each fed
    the previous steps' own hidden states. Drafted token `k` is accepted iff it and every earlier one match the
    target's top-1, and the target adds one token of its own (the bonus), so the length is
    `1 + sum_k prod_{j <= k} correct_j[t]` (tau with the bonus included, as EAGLE reports it). This is the
    per-position form of `1 + sum_k prod_{j <= k} acc_j`; it keeps the correlation between steps. Caveats: inputs are
    teacher-forced ground truth rather than the drafted tokens, a chain stops where the loss mask stops (end of an
    assistant turn), and decoding uses a tree, which accepts more than a chain.

    Args:
        correct (`torch.BoolTensor` of shape `(steps, batch, seq)`): `step_correct` of each step.

    Returns:
        `torch.FloatTensor` of shape `(batch, seq)`, values in `[1, steps + 1]`.
    """
    return 1.0 + torch.cumprod(correct.float(), dim=0).sum(dim=0)


def feature_regression_per_position(draft_hidden: torch.Tensor, target_next_hidden: torch.Tensor) -> torch.Tensor:
    """EAGLE-1's feature regression term (SmoothL1) per position. An ablation: EAGLE-3 itself has no such term.

    EAGLE-1 regresses the draft's predicted feature onto the target's top-layer feature (the post-norm input of the
    target's `lm_head`) of the **next** position, the one whose logits predict the same token. For an EAGLE-3 head
    at step 0, index `t` (predicting `x[t + 2]`), that is `norm(g_0[t])` (what the draft's `lm_head` reads) against
    the target's final hidden state at `t + 1`. EAGLE-1 averages over the hidden dimension here, then sums over
    masked positions and divides by the mask count plus `1e-5` (done by the trainer with
    `step_loss_mask(loss_mask, 0)`).

    Args:
        draft_hidden (`torch.Tensor` of shape `(batch, seq, hidden_size)`): `norm(g_0)`.
        target_next_hidden (`torch.Tensor` of shape `(batch, seq, hidden_size)`): `shift_left(final_hidden, 1)`.

    Returns:
        `torch.FloatTensor` of shape `(batch, seq)`.
    """
    if draft_hidden.shape[-1] != target_next_hidden.shape[-1]:
        raise ValueError(
            f"feature regression needs the draft hidden_size ({draft_hidden.shape[-1]}) to equal the target's "
            f"({target_next_hidden.shape[-1]})."
        )
    return F.smooth_l1_loss(draft_hidden.float(), target_next_hidden.float(), reduction="none").mean(dim=-1)


__all__ = [
    "chain_acceptance_lengths",
    "feature_regression_per_position",
    "shift_left",
    "soft_label_loss",
    "soft_label_loss_per_sample",
    "soft_targets",
    "step_correct",
    "step_loss_mask",
    "step_targets",
    "ttt_attention_mask",
]
