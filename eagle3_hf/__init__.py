"""eagle3_hf: EAGLE-3 speculative decoding as a native add-on to Hugging Face Transformers."""

from transformers import AutoConfig, AutoModel

from .configuration_eagle3 import Eagle3Config
from .generation import DraftTree, Eagle3GenerateOutput, eagle3_generate  # also installs the generate() wrapper
from .modeling_eagle3 import Eagle3DraftModel, Eagle3DraftOutput


__version__ = "0.1.0"

# Import side effects: the stock Auto classes resolve model_type "eagle3" to our classes, and (in .generation)
# generate(..., assistant_model=<Eagle3DraftModel>) is routed to eagle3_generate; nothing else changes.
AutoConfig.register("eagle3", Eagle3Config, exist_ok=True)
AutoModel.register(Eagle3Config, Eagle3DraftModel, exist_ok=True)

__all__ = [
    "DraftTree",
    "Eagle3Config",
    "Eagle3DraftModel",
    "Eagle3DraftOutput",
    "Eagle3GenerateOutput",
    "__version__",
    "eagle3_generate",
]
