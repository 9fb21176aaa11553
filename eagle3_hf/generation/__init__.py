"""EAGLE-3 decoding inside `generate()`: the tree loop and the chain-mode candidate generator.

- `tree`: pure tensor functions (candidate rerank, tree masks, positions, paths, greedy and sampling acceptance);
- `drafter`: growing a draft tree with the head; `lookup`: prompt-lookup chains grafted onto it;
- `verify`: the target's one-pass tree forward; `kv_cache`: keeping only the accepted path;
- `decoding`: `eagle3_generate`, the tree loop; `integration`: the `generate(assistant_model=...)` hook;
- `candidate_generator`: chain mode in Transformers' own assisted loop;
- `cpu_packing`, `gqa_attention`: the CPU fast path (packed MKL / oneDNN weights, grouped-query SDPA under tree masks).
- `draft_precision`: on CPU, the head drafts with a bfloat16 copy where that is timed faster.
- `cuda_attention`: on CUDA, the masked tree and draft forwards run without cuDNN's per-shape SDPA plans.

Importing this package installs the narrow `GenerationMixin.generate` wrapper (see `integration.py`) that sends
`generate(..., assistant_model=<Eagle3DraftModel>)` to `eagle3_generate`.
"""

from .decoding import DEFAULT_TREE, Eagle3GenerateOutput, TreeSettings, eagle3_generate
from .integration import install_generate_wrapper, original_generate, uninstall_generate_wrapper
from .tree import DraftTree


install_generate_wrapper()

__all__ = [
    "DEFAULT_TREE",
    "DraftTree",
    "Eagle3GenerateOutput",
    "TreeSettings",
    "eagle3_generate",
    "install_generate_wrapper",
    "original_generate",
    "uninstall_generate_wrapper",
]
