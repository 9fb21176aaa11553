"""EAGLE-3 decoding inside `generate()`: the tree loop and the chain-mode candidate generator.

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
