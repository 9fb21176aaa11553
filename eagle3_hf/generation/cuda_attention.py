"""Keep speculative decoding's attention off cuDNN's SDPA kernel on CUDA.

From CUDA 13 builds of torch (2.11 on), `scaled_dot_product_attention` on Hopper and Blackwell GPUs tries cuDNN's
attention first (`priority_order` in torch's `sdp_utils.cpp`, unless `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`). cuDNN
builds an execution plan for every new shape of query, keys and mask, and decoding makes a new shape at every step:
the cache grows. A process that has met a length before reuses its plan; speculation meets new lengths all the time
(the cache grows by a different number of tokens each round, every draft level attends to a longer cache than the
one before, and a tree's rows change with its shape).

Measured on one H200 (torch 2.11.0+cu130, a Llama-3.1-8B-shaped bf16 target; `docs/cuda.md`): one attention call
at a cache length new to the process took 40-57 ms with the default backends (a 60-row tree query under its mask)
and 0.05-0.07 ms with cuDNN's SDPA off; a one-row query as plain decoding makes, 35-49 ms. A fixed 60-node tree
decoded at 0.94x plain `generate` with cuDNN left in torch's order and 2.67x without it. Plain `generate` pays the
same per new length: its first call took 23.1 s for 256 tokens, its second (every length met before) 9.5 s, and
both 9.6 and 8.7 s with cuDNN's SDPA off, with identical output. Without cuDNN these calls go to the flash or
memory-efficient kernel, which build no plans. fp32 is unaffected either way (cuDNN's attention runs half precision
only).

`speculative_attention_kernels(device)` is the context a speculative `generate` call runs in from its prefill to
its last token (tree decoding in `decoding._TreeDecoder.run`, chain mode in `integration.generate`), and that the
public tree and draft functions (`verify_tree`, `TreeDrafter`, the chain drafter) enter themselves when called on
their own: it switches the cuDNN backend off (`torch.backends.cuda.enable_cudnn_sdp(False)`) for the duration and
restores the caller's setting after; every other backend choice of the caller stays as it was. Nested use is a
no-op. A nullcontext off CUDA, and inside `leave_sdpa_to_torch()` (for comparisons: `scripts/device_check.py` times
the tree both ways).
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
    """Within it, speculative decoding leaves the SDPA backend to torch's own order, cuDNN included."""
    global _leave_to_torch
    before, _leave_to_torch = _leave_to_torch, True
    try:
        yield
    finally:
        _leave_to_torch = before


def speculative_attention_kernels(device: torch.device):
    """The context for speculative decoding's forwards on `device`: cuDNN's SDPA off on CUDA, nothing elsewhere."""
    if _leave_to_torch or torch.device(device).type != "cuda":
        return nullcontext()
    return _without_cudnn_sdpa()


__all__ = ["leave_sdpa_to_torch", "speculative_attention_kernels"]
