"""Write a head in the dialects the serving engines read (user guide: docs/checkpoint-dialects.md).

`save_in_dialect(model, directory, dialect)` for `"eagle3_hf"` (`save_pretrained`), `"eagle"` (official
SafeAILab), `"sglang"` (SGLang / SpecForge, read by vLLM too) and `"speculators"` (vLLM speculators). Everything is
built before anything is written (a refused export creates no folder), then staged in a hidden folder next to the
destination and renamed into place (`eagle3_hf.atomic.atomic_directory`).
"""

import json
import logging
import os
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from ..atomic import atomic_directory
from ..configuration_eagle3 import Eagle3Config, default_target_layer_ids
from .reading import DIALECT_SWITCHES, LLAMA_KEYS, rope_reads_max_position_embeddings


logger = logging.getLogger(__name__)

WRITABLE_DIALECTS = ("eagle3_hf", "eagle", "sglang", "speculators")
ARCHITECTURES = {"eagle": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle3", "speculators": "Eagle3Speculator"}
SPECULATORS_VERSION = "0.3.0"


def save_in_dialect(
    model,
    save_directory: str | os.PathLike,
    dialect: str,
    *,
    overwrite: bool = False,
    max_position_embeddings: int | None = None,
    speculative_tokens: int = 3,
    verifier_architectures: list[str] | None = None,
) -> Path:
    """Write `model` as a checkpoint folder of `dialect` (one of `WRITABLE_DIALECTS`), atomically.

    Args:
        dialect (`str`): `"eagle3_hf"` (`save_pretrained`), `"eagle"` (official SafeAILab), `"sglang"` (SGLang /
            SpecForge; vLLM reads it too: the usual choice for serving) or `"speculators"` (vLLM speculators).
        overwrite (`bool`): replace an existing non-empty folder (only once the new one is complete).
        max_position_embeddings (`int`, *optional*): value written for the engines (default: the config's);
            refused (`ValueError`) for a head whose RoPE reads it (`rope_reads_max_position_embeddings`: dynamic
            NTK), where another value would change the outputs.
        speculative_tokens (`int`, defaults to 3): `speculators_config.proposal_methods[0].speculative_tokens`.
        verifier_architectures (`list[str]`, *optional*): `speculators_config.verifier.architectures`.
    """
    if dialect not in WRITABLE_DIALECTS:
        raise ValueError(f"dialect={dialect!r}; expected one of {WRITABLE_DIALECTS}.")
    if dialect != "eagle3_hf":  # build everything first: a refused export creates no folder at all
        options = (max_position_embeddings, speculative_tokens, verifier_architectures)
        tensors, config_dict = _export_payload(model, dialect, *options)
    with atomic_directory(Path(save_directory), overwrite) as staging:
        if dialect == "eagle3_hf":  # the card's snippets name the destination, not the staging folder
            model.save_pretrained(staging, model_card_kwargs={"repo_id": str(save_directory)})
        else:
            save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
            (staging / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    return Path(save_directory)


def _export_payload(model, dialect, max_position_embeddings, speculative_tokens, verifier_architectures):
    config = model.config
    state = {key: tensor.detach().to("cpu").contiguous() for key, tensor in model.state_dict().items()}
    llama = _llama_config_dict(config, max_position_embeddings, state["fc.weight"].dtype)
    ids = list(config.target_layer_ids)
    if dialect == "speculators":
        if model.get_input_embeddings() is None:
            raise ValueError(
                "The speculators dialect ships the verifier's embedding (embed_tokens.weight) but the head has none: "
                "call draft.attach_target(target) first (CLI: --target)."
            )
        if config.target_model_name_or_path is None:
            raise ValueError("The speculators dialect records the verifier: set config.target_model_name_or_path.")
        if len(ids) != 3:
            logger.warning("vLLM's EAGLE-3 fc reads 3 target layers; this head fuses %d.", len(ids))
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().to("cpu", state["fc.weight"].dtype)
        if not config.norm_before_lm_head:
            raise ValueError(
                "norm_before_lm_head=False (SpecForge's norm_output: false): speculators always computes the logits "
                "after the final norm. Write 'sglang' instead."
            )
        layer_config = _sliding_window_fields(config)
        return state, _speculators_config_dict(
            config, {**llama, **layer_config}, speculative_tokens, verifier_architectures
        )
    _check_single_midlayer_head(config, dialect)
    rope_type = config.rope_parameters.get("rope_type", "default")
    if dialect == "eagle" and (
        len(ids) != 3 or config.head_dim * config.num_attention_heads != config.hidden_size
        or rope_type not in ("default", "linear", "dynamic")
    ):  # fmt: skip
        raise ValueError(
            "The official EAGLE code fuses exactly 3 target layers, derives head_dim = hidden_size / "
            f"num_attention_heads and knows only linear/dynamic RoPE scaling; this head has target_layer_ids={ids}, "
            f"head_dim={config.head_dim}, rope_type={rope_type!r}. Write 'sglang' instead."
        )
    if dialect == "sglang" and len(ids) != 3:
        raise ValueError(
            f"target_layer_ids={ids}: SpecForge's and SGLang's fc reads exactly 3 target layers. Write 'speculators' "
            "instead."
        )
    if dialect == "eagle":  # it reads no ids; with L unknown, ids[-1] + 3 is the only L that could fit
        layers = config.target_num_hidden_layers or ids[-1] + 3
        if ids != default_target_layer_ids(layers):
            raise ValueError(
                f"The official EAGLE code reads no layer ids and always taps [2, L//2, L-3]; this head has "
                f"target_layer_ids={ids}, not the defaults for L={layers} ({default_target_layer_ids(layers)}). "
                "Write 'sglang' instead."
            )
    state = {
        ("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): t for k, t in state.items()
    }
    fields_ = {
        **llama,
        "architectures": [ARCHITECTURES[dialect]],
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        # vLLM reads the top-level ids as layer inputs (EAGLE convention), SGLang reads eagle_config as outputs.
        "eagle_aux_hidden_state_layer_ids": ids,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids], "use_aux_hidden_state": True},
        "target_model_name_or_path": config.target_model_name_or_path,
        "target_num_hidden_layers": config.target_num_hidden_layers,
    }
    if dialect == "sglang":  # SpecForge's meaning of norm_output (default true): the logits are after the norm
        fields_.update(fc_norm=config.fc_norm, norm_output=config.norm_before_lm_head)
    else:
        _official_fields(config, fields_, state)
    return state, fields_


def _check_single_midlayer_head(config: Eagle3Config, dialect: str) -> None:
    """What the `eagle` / `sglang` engines cannot run: `ValueError` naming the field and the dialect to use."""
    if config.num_hidden_layers != 1:  # SGLang raises for others; the official code and SpecForge build one
        raise ValueError(
            f"num_hidden_layers={config.num_hidden_layers}: the {dialect} dialect stores exactly one layer "
            "('midlayer'); write 'speculators' or 'eagle3_hf' instead."
        )
    if config.attention_bias or config.mlp_bias:
        raise ValueError(f"The {dialect} dialect has no attention/MLP biases; this head has some.")
    readable = {"sglang": ("fc_norm", "norm_before_lm_head"), "eagle": ("trained_embedding",)}[dialect]
    unsupported = {
        "norm_before_fc": config.norm_before_fc,
        "fc_norm": config.fc_norm,
        "norm_before_residual": config.norm_before_residual,
        "normed_feedback": config.normed_feedback,
        "norm_before_lm_head": not config.norm_before_lm_head,
        "trained_embedding": config.trained_embedding,
        "draft_layer_types": config.draft_layer_types is not None and "sliding_attention" in config.draft_layer_types,
    }
    if refused := sorted(key for key, used in unsupported.items() if used and key not in readable):
        raise ValueError(
            f"The {dialect} dialect's engine cannot run this head's {', '.join(refused)} (set on it); write "
            "'speculators' (vLLM) or 'eagle3_hf' instead."
        )


def _official_fields(config: Eagle3Config, fields_: dict, state: dict) -> None:
    """Adjust an `eagle` config and tensors to what the official code reads (eagle/model/configs.py, cnets.py)."""
    if config.target_hidden_size == config.hidden_size:
        # With target_hidden_size present the official Model skips copying the target's embedding (and loads
        # non-strictly), so it would run with a random one: the key is left out whenever it says nothing new.
        del fields_["target_hidden_size"]
    elif not config.trained_embedding:
        raise ValueError(
            f"target_hidden_size={config.target_hidden_size} != hidden_size={config.hidden_size}: the official EAGLE "
            "code then uses no target embedding and the head ships none. Write 'sglang' instead."
        )
    rope = dict(config.rope_parameters)
    if rope.get("rope_type", "default") != "default":
        # EConfig requires exactly {type, factor} (factor a float > 1) and the scaled RoPE runs at base 10000.
        if rope.get("rope_theta", 10000.0) != 10000.0:
            raise ValueError(
                f"rope_theta={rope['rope_theta']} with {rope['rope_type']!r} scaling: the official EAGLE code uses "
                "base 10000 whenever rope_scaling is set. Write 'sglang' instead."
            )
        if not float(rope.get("factor", 0)) > 1.0:
            raise ValueError(f"rope_scaling factor={rope.get('factor')}: the official EAGLE code needs a float > 1.")
        fields_["rope_scaling"] = {"type": rope["rope_type"], "factor": float(rope["factor"])}
        del fields_["rope_theta"]
    if config.draft_vocab_size == config.vocab_size:  # the official loader deletes the buffers then
        del state["d2t"], state["t2d"]


def _sliding_window_fields(config: Eagle3Config) -> dict:
    """speculators' `transformer_layer_config` fields for sliding-window layers (as its own trainer writes them)."""
    if config.draft_layer_types is None:
        return {}
    return {
        "layer_types": list(config.draft_layer_types),
        "sliding_window": config.draft_sliding_window,
        "use_sliding_window": "sliding_attention" in config.draft_layer_types,
    }


def _llama_config_dict(config: Eagle3Config, max_position_embeddings: int | None, dtype: torch.dtype) -> dict:
    """The Llama fields engines read, with RoPE as top-level `rope_theta` / `rope_scaling` (what they look for)."""
    rope = dict(config.rope_parameters or {})
    theta, rope_type = rope.pop("rope_theta", 10000.0), rope.pop("rope_type", "default")
    fields_ = {key: getattr(config, key) for key in LLAMA_KEYS}
    reads = rope_reads_max_position_embeddings(config.rope_parameters)
    if max_position_embeddings not in (None, config.max_position_embeddings):
        if reads:
            raise ValueError(
                f"max_position_embeddings={max_position_embeddings}: this head's {rope_type!r} RoPE computes its "
                f"frequencies from its max_position_embeddings={config.max_position_embeddings}, so another value "
                "would change its outputs; leave max_position_embeddings unset."
            )
        fields_["max_position_embeddings"] = max_position_embeddings
    if fields_["max_position_embeddings"] == 2048:
        advice = (
            f"it is kept: the {rope_type!r} RoPE reads it" if reads else "pass max_position_embeddings=<the target's>"
        )
        logger.warning(
            "Writing max_position_embeddings=2048 (the official placeholder), which crashes vLLM (vllm#48894); %s.",
            advice,
        )
    return {
        **fields_,
        "model_type": "llama",
        "rope_theta": theta,
        # `type` for the official code and transformers 4, `rope_type` for everything newer.
        "rope_scaling": None if rope_type == "default" else {"rope_type": rope_type, "type": rope_type, **rope},
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "transformers_version": transformers.__version__,
    }


def _speculators_config_dict(config, llama: dict, speculative_tokens: int, verifier_architectures) -> dict:
    layer_config = {key: value for key, value in llama.items() if key not in ("torch_dtype", "transformers_version")}
    return {
        "architectures": [ARCHITECTURES["speculators"]],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.target_layer_ids),
        "target_num_hidden_layers": config.target_num_hidden_layers,  # ours: official-style taps need L
        **{key: bool(getattr(config, field)) for key, field in DIALECT_SWITCHES["speculators"].items()},
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {
                "name_or_path": config.target_model_name_or_path,
                "architectures": list(verifier_architectures or []),
            },
        },
        "torch_dtype": llama["torch_dtype"],
        "transformers_version": llama["transformers_version"],
    }


__all__ = ["ARCHITECTURES", "SPECULATORS_VERSION", "WRITABLE_DIALECTS", "save_in_dialect"]
