"""The precision the head drafts in: on CPU, a bfloat16 copy of a float32 head wherever that is measured faster.

A round runs the head on a few rows at a time (the tree's `top_k` frontier, the accepted tokens), so each of its
matrix products reads every weight once for a handful of rows: on CPU they are bound by memory bandwidth, and
bfloat16 weights halve what is read (with `avx512_bf16` or AMX, oneDNN also computes them faster). Measured on a
2-core AMD EPYC with `avx512_bf16` (session 33; SmolLM2-135M-Instruct's shipped head, 150 cached entries, 2 threads):
growing a 12-node, 4-level tree (three 8-row forwards) took 13.8 ms in float32 and 4.9 ms in bfloat16, encoding 3
accepted tokens 4.5 ms and 1.3 ms. Through `generate` (40 MT-bench first turns, 96 new tokens, the head's 12 / 4 / 8
tree with 6 lookup tokens, interleaved with plain `generate`): a round took 89.0 ms against 77.7 ms, 1.29x against
1.48x plain decoding, with the same tau (2.79).

The head's precision cannot change what is emitted: only the target's verification decides, so greedy output stays
identical to plain `generate` and sampling keeps the target's distribution. It changes only which tokens are
drafted; the measured acceptance did not move.

The caller's head is left as it is (its dtype, weights and packing): rounds draft with a copy (`drafting_head`),
made once per head and dtype, kept for later calls and made again when the head's weights change. The copy shares
the target's token embedding. With `tree_draft_dtype="auto"` (the default) the copy is used only where it is timed
faster than the head itself (`low_precision_pays`), so a CPU without fast bfloat16 keeps drafting in float32.
"""

import copy
import statistics
import time
import weakref

import torch
from transformers.utils import logging

from ..modeling_eagle3 import Eagle3DraftModel
from .cpu_packing import unpack_linear_weights


logger = logging.get_logger(__name__)

# a float32 head on CPU drafts in this dtype where it is measured faster
CPU_DRAFT_DTYPE = torch.bfloat16
# the copy must save at least this share of a forward's time to be used by "auto"
MIN_SAVING = 0.1

# head -> {dtype: (the head's weight state when copied, the copy)}
_COPIES: "weakref.WeakKeyDictionary[Eagle3DraftModel, dict]" = weakref.WeakKeyDictionary()
# head -> {rows: whether the CPU_DRAFT_DTYPE copy's forward is faster}, decided once per head and row count
_PAYS: "weakref.WeakKeyDictionary[Eagle3DraftModel, dict]" = weakref.WeakKeyDictionary()


def resolve_draft_dtype(requested) -> torch.dtype | None:
    """`tree_draft_dtype` as a floating `torch.dtype`, or `None` for `"auto"` (also the default, `None`).

    Accepts a `torch.dtype` or its name (`"bfloat16"`, `"float32"`, `"float16"`, ...).
    """
    if requested is None or requested == "auto":
        return None
    dtype = getattr(torch, requested, None) if isinstance(requested, str) else requested
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"tree_draft_dtype={requested!r}: expected 'auto' or a floating torch.dtype or its name "
            "(e.g. torch.bfloat16, 'bfloat16', 'float32')."
        )
    return dtype


def drafting_head(draft: Eagle3DraftModel, requested=None, rows: int = 8) -> Eagle3DraftModel:
    """The head the rounds draft with: `draft` itself, or a copy of it in another dtype (`low_precision_copy`).

    Args:
        draft ([`Eagle3DraftModel`]): the head, prepared for the target (embedding attached, on its device).
        requested (`torch.dtype`, `str` or `None`): `generate`'s `tree_draft_dtype`; `None` / `"auto"`:
            `auto_draft_dtype`.
        rows (`int`): the rows of a typical draft forward (the tree's `top_k`), for the timing of `"auto"`.
    """
    dtype = resolve_draft_dtype(requested)
    if dtype is None:
        dtype = auto_draft_dtype(draft, rows)
    return draft if dtype == draft.fc.weight.dtype else low_precision_copy(draft, dtype)


def auto_draft_dtype(draft: Eagle3DraftModel, rows: int) -> torch.dtype:
    """`CPU_DRAFT_DTYPE` for a float32 head on CPU where `low_precision_pays`, else the head's own dtype."""
    current = draft.fc.weight.dtype
    if draft.fc.weight.device.type != "cpu" or current != torch.float32:
        return current
    return CPU_DRAFT_DTYPE if low_precision_pays(draft, rows) else current


def low_precision_copy(draft: Eagle3DraftModel, dtype: torch.dtype) -> Eagle3DraftModel:
    """`draft` in `dtype`, sharing the target's token embedding: made the first time, then kept while the head's
    parameters and buffers are the same tensors, unmodified (a training step or a load makes it again)."""
    state = _weight_state(draft)
    kept = _COPIES.setdefault(draft, {})
    if dtype in kept and kept[dtype][0] == state:
        return kept[dtype][1]
    # deepcopy's memo: the target's embedding is shared, not copied; the head's packs (opaque tensors, which
    # cannot be copied) become empty, and the copy's layers plain `nn.Linear` again: packs serve float32 only
    memo = {id(module._packs): {} for module in draft.modules() if hasattr(module, "_packs")}
    embedding = draft._embedding
    if embedding is not None and not draft.config.trained_embedding:
        memo[id(embedding)] = embedding
    copied = copy.deepcopy(draft, memo)
    unpack_linear_weights(copied)
    copied.to(dtype).eval().requires_grad_(False)
    kept[dtype] = (state, copied)
    return copied


def low_precision_pays(draft: Eagle3DraftModel, rows: int, repeats: int = 7) -> bool:
    """Whether a head forward over `rows` tree nodes (after 64 cached entries) is at least `MIN_SAVING` faster with
    the `CPU_DRAFT_DTYPE` copy than with `draft`: timed once per head and row count (medians of `repeats`), then
    remembered (the time depends on the shapes, not on the weights' values). Where it does not pay, no copy is
    kept."""
    decided = _PAYS.setdefault(draft, {})
    if rows not in decided:
        copied = low_precision_copy(draft, CPU_DRAFT_DTYPE)
        head_seconds, copy_seconds = (_forward_seconds(model, rows, repeats) for model in (draft, copied))
        decided[rows] = copy_seconds < (1 - MIN_SAVING) * head_seconds
        if not decided[rows]:
            del _COPIES[draft][CPU_DRAFT_DTYPE]
        logger.info(
            "Tree decoding on CPU: a head forward over %d nodes takes %.2f ms in float32 and %.2f ms in %s; the head "
            "drafts in %s (generate(..., tree_draft_dtype=...) sets it).",
            rows,
            1000 * head_seconds,
            1000 * copy_seconds,
            _name(CPU_DRAFT_DTYPE),
            _name(CPU_DRAFT_DTYPE if decided[rows] else torch.float32),
        )
    return decided[rows]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@torch.no_grad()
def _forward_seconds(model: Eagle3DraftModel, rows: int, repeats: int, cached: int = 64) -> float:
    """Median seconds of one forward over `rows` nodes fed back from the head's own outputs after `cached` entries
    (what each level of a tree costs), warmed up first."""
    device, config = model.fc.weight.device, model.config
    features = torch.zeros(1, cached, config.num_target_features, device=device)
    ids = torch.zeros(1, rows, dtype=torch.long, device=device)
    times = []
    for attempt in range(repeats + 2):
        out = model(input_ids=ids[:, :1].expand(1, cached), target_hidden_states=features, use_cache=True)
        hidden = out.hidden_states[:, -1:].expand(1, rows, -1)
        start = time.perf_counter()
        model(input_ids=ids, hidden_states=hidden, cache=out.cache, use_cache=True)
        if attempt >= 2:  # the first two warm the kernels up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _weight_state(model: torch.nn.Module) -> tuple:
    """Identity and version of every parameter and buffer: changes when any is replaced or modified in place."""
    return tuple((tensor.data_ptr(), tensor._version) for tensor in (*model.parameters(), *model.buffers()))


__all__ = [
    "CPU_DRAFT_DTYPE",
    "auto_draft_dtype",
    "drafting_head",
    "low_precision_copy",
    "low_precision_pays",
    "resolve_draft_dtype",
]
