"""Keep the masked attention of tree and draft forwards off cuDNN's SDPA kernel on CUDA.

From CUDA 13 builds of torch (2.11 on), `scaled_dot_product_attention` on Hopper and Blackwell GPUs tries cuDNN's
attention first (`priority_order` in torch's `sdp_utils.cpp`, unless `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`). cuDNN
builds an execution plan for every new shape of query, keys and mask, and speculative decoding makes a new shape at
nearly every call: the cache grows by a different number of tokens each round, and every draft level attends to a
longer cache than the one before. Plain decoding is spared (its one-token steps carry no mask), so the cost lands on
speculation alone.

Measured on one H200 (torch 2.11.0+cu130, a Llama-3.1-8B-shaped bf16 target, `docs/cuda.md`): inside the decoding
loop a 60-node verification took 65 ms and the head's update 44 ms, against 25 ms and 1.8 ms for the same calls
timed one by one at a cache length that repeats (where a plan, once built, is reused). The tree decoded at 1.26x
plain `generate`, while Transformers' own assisted loop reached 2.23x with the same drafts. Per-shape plans are the
cause that fits those numbers (the same was measured for torch 2.11 on a B200 in modelscope/FunASR#3704); the GPU
check's `sdpa_new_shapes` section measures it directly, with and without this context. Without cuDNN these calls go
to the memory-efficient kernel, which takes any additive mask and builds no plan. fp32 is unaffected either way
(cuDNN's attention runs half precision only).

`tree_attention_kernels(device)` is the context the tree loop and the chain drafter run their masked forwards in: it
switches the cuDNN backend off (`torch.backends.cuda.enable_cudnn_sdp(False)`) for the duration and restores the
caller's setting after; every other backend choice of the caller stays as it was. A nullcontext off CUDA, and
inside `leave_sdpa_to_torch()` (for comparisons: `scripts/device_check.py` times the tree both ways).
"""

from contextlib import contextmanager, nullcontext

import torch


_leave_to_torch = False  # set inside `leave_sdpa_to_torch()`


@contextmanager
def _without_cudnn_sdpa():
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    if enabled:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        if enabled:
            torch.backends.cuda.enable_cudnn_sdp(True)


@contextmanager
def leave_sdpa_to_torch():
    """Within it, tree and draft forwards leave the SDPA backend to torch's own order, cuDNN included."""
    global _leave_to_torch
    before, _leave_to_torch = _leave_to_torch, True
    try:
        yield
    finally:
        _leave_to_torch = before


def tree_attention_kernels(device: torch.device):
    """The context for a forward with a tree or draft mask on `device`: cuDNN's SDPA off on CUDA, nothing elsewhere."""
    if _leave_to_torch or torch.device(device).type != "cuda":
        return nullcontext()
    return _without_cudnn_sdpa()


__all__ = ["leave_sdpa_to_torch", "tree_attention_kernels"]
