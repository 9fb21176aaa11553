"""Route `target.generate(..., assistant_model=<Eagle3DraftModel>)` to EAGLE-3 tree decoding.

Transformers picks its candidate generator in a closed if/elif, so the only way to make the plain call
`target.generate(input_ids, assistant_model=draft)` run a tree is a wrapper around `GenerationMixin.generate`.
The wrapper is deliberately narrow: it reroutes **only** when `assistant_model` is an [`Eagle3DraftModel`], to the
documented `generate(custom_generate=eagle3_generate, draft_model=draft)`. Every other call goes to the original
`generate` untouched. `import eagle3_hf` installs it once (idempotent); `original_generate` is the original.

`eagle3_mode="chain"` instead runs the stock assisted-decoding loop with the chain-mode EAGLE-3 candidate
generator (a baseline without a tree).

`generate()` drops `tokenizer` before calling a callable, and then builds its stopping criteria without it, so the
wrapper turns `stop_strings` into the `StopStringCriteria` that `generate()` would have built and passes it as a
stopping criterion.
"""

import copy
import functools
import inspect

from transformers.generation import StoppingCriteriaList, StopStringCriteria
from transformers.generation.utils import GenerationMixin

from ..modeling_eagle3 import Eagle3DraftModel
from .cuda_attention import speculative_attention_kernels
from .decoding import eagle3_generate


EAGLE3_MODES = ("tree", "chain")
_MARKER = "_eagle3_original_generate"

# The undecorated-by-us `generate`, even if this module is imported (or reloaded) more than once.
original_generate = getattr(GenerationMixin.generate, _MARKER, GenerationMixin.generate)
_SIGNATURE = inspect.signature(original_generate)


def _bind(model, args: tuple, kwargs: dict) -> dict:
    """All arguments of a `generate` call by name (positional ones included), `**kwargs` flattened in."""
    bound = _SIGNATURE.bind(model, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self")
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


def _generation_setting(model, arguments: dict, name: str):
    """The value `generate()` will use for the generation-config field `name`: the call's keyword argument, else
    the call's `generation_config`, else the model's (the precedence of `_prepare_generation_config`)."""
    if name in arguments:
        return arguments[name]
    value = getattr(arguments.get("generation_config"), name, None)
    return value if value is not None else getattr(model.generation_config, name, None)


def _stop_strings_to_criteria(model, arguments: dict) -> None:
    """Replace the call's stop strings by the `StopStringCriteria` built from them and `tokenizer`, in place."""
    tokenizer = arguments.pop("tokenizer", None)
    stop_strings = _generation_setting(model, arguments, "stop_strings")
    if tokenizer is None or stop_strings is None:
        return  # without a tokenizer generate() raises its own error about stop strings
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings)])
    # the same rule as generate(): a StopStringCriteria among the user's own criteria takes precedence
    arguments["stopping_criteria"] = model._merge_criteria_processor_list(
        criteria, arguments.get("stopping_criteria") or StoppingCriteriaList()
    )
    config = arguments.get("generation_config")
    if config is not None and "stop_strings" not in arguments and model.generation_config.stop_strings is None:
        # the stop strings came from the call's config; a keyword next to it would draw a deprecation warning
        arguments["generation_config"] = copy.deepcopy(config)
        arguments["generation_config"].stop_strings = None
    else:
        arguments["stop_strings"] = None  # a keyword also overrides the model's generation_config


@functools.wraps(original_generate)
def generate(self, *args, **kwargs):
    mode = kwargs.pop("eagle3_mode", None)
    draft = kwargs.get("assistant_model")
    if not isinstance(draft, Eagle3DraftModel) and len(args) > 6:
        draft = _bind(self, args, kwargs).get("assistant_model")  # passed positionally
    if not isinstance(draft, Eagle3DraftModel):
        if mode is not None:
            raise ValueError("eagle3_mode= needs assistant_model= to be an Eagle3DraftModel.")
        return original_generate(self, *args, **kwargs)
    if mode not in (None, *EAGLE3_MODES):
        raise ValueError(f"eagle3_mode must be one of {EAGLE3_MODES}, got {mode!r}.")
    arguments = _bind(self, args, kwargs)
    if mode == "chain":
        from .candidate_generator import chain_mode

        config, chain_length = arguments.get("generation_config"), arguments.get("num_assistant_tokens")
        # the assisted loop's verifications too meet a new shape every round: off cuDNN's SDPA plans (CUDA)
        with (
            chain_mode(self, draft, config, num_assistant_tokens=chain_length),
            speculative_attention_kernels(self.device),
        ):
            return original_generate(self, *args, **kwargs)
    if arguments.get("custom_generate") is not None:
        raise ValueError("Pass either an Eagle3DraftModel as assistant_model or custom_generate=, not both.")
    if _generation_setting(self, arguments, "token_healing"):
        raise ValueError(
            "EAGLE-3 tree decoding does not support token_healing=True: generate() does not hand the tokenizer to "
            "a custom decoding loop. Heal the prompt first with `target.heal_tokens(input_ids, tokenizer)` and pass "
            "the result."
        )
    _stop_strings_to_criteria(self, arguments)
    arguments.pop("assistant_model")
    streamer = arguments.pop("streamer", None)
    return original_generate(
        self, custom_generate=eagle3_generate, draft_model=draft, eagle3_streamer=streamer, **arguments
    )


setattr(generate, _MARKER, original_generate)


def install_generate_wrapper() -> None:
    """Install the wrapper on `GenerationMixin.generate` (no-op when already installed)."""
    if not hasattr(GenerationMixin.generate, _MARKER):
        GenerationMixin.generate = generate


def uninstall_generate_wrapper() -> None:
    """Put the original `GenerationMixin.generate` back."""
    GenerationMixin.generate = getattr(GenerationMixin.generate, _MARKER, GenerationMixin.generate)
