"""eagle3_hf: EAGLE-3 speculative decoding as a native add-on to Hugging Face Transformers."""

from transformers import AutoConfig, AutoModel

from .configuration_eagle3 import Eagle3Config
from .generation import DraftTree, Eagle3GenerateOutput, eagle3_generate  # also installs the generate() wrapper
from .generation.cpu_packing import pack_linear_weights, unpack_linear_weights
from .modeling_eagle3 import Eagle3DraftModel, Eagle3DraftOutput


__version__ = "0.1.0"

# Import side effects: the stock Auto classes resolve model_type "eagle3" to our classes, and (in .generation)
# generate(..., assistant_model=<Eagle3DraftModel>) is routed to eagle3_generate; nothing else changes.
AutoConfig.register("eagle3", Eagle3Config, exist_ok=True)
AutoModel.register(Eagle3Config, Eagle3DraftModel, exist_ok=True)

# Training and chain-mode classes pull in Trainer/accelerate: imported on first use to keep `import eagle3_hf` light.
_LAZY = {
    "Eagle3Trainer": "eagle3_hf.training.trainer",
    "Eagle3TrainingArguments": "eagle3_hf.training.training_args",
    "DataCollatorForEagle3": "eagle3_hf.training.data",
    "Eagle3CandidateGenerator": "eagle3_hf.generation.candidate_generator",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eagle3_hf' has no attribute {name!r}")


__all__ = [
    "DataCollatorForEagle3",
    "Eagle3CandidateGenerator",
    "Eagle3Trainer",
    "Eagle3TrainingArguments",
    "DraftTree",
    "Eagle3Config",
    "Eagle3DraftModel",
    "Eagle3DraftOutput",
    "Eagle3GenerateOutput",
    "__version__",
    "eagle3_generate",
    "pack_linear_weights",
    "unpack_linear_weights",
]
