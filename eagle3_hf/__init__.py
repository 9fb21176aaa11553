"""eagle3_hf: EAGLE-3 speculative decoding as a native add-on to Hugging Face Transformers."""

from transformers import AutoConfig, AutoModel

from .configuration_eagle3 import Eagle3Config
from .modeling_eagle3 import Eagle3DraftModel, Eagle3DraftOutput


__version__ = "0.1.0"

# The only import side effect: the stock Auto classes resolve model_type "eagle3" to our classes.
AutoConfig.register("eagle3", Eagle3Config, exist_ok=True)
AutoModel.register(Eagle3Config, Eagle3DraftModel, exist_ok=True)

__all__ = ["Eagle3Config", "Eagle3DraftModel", "Eagle3DraftOutput", "__version__"]
