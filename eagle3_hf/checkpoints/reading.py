"""Read every EAGLE-3 checkpoint dialect (user guide: docs/checkpoint-dialects.md).

`Eagle3DraftModel.from_pretrained` calls `from_pretrained_any_dialect`. Native folders (`model_type: "eagle3"`) go
through the stock Transformers loader; the others are detected (`detect_dialect`), their config is converted to an
`Eagle3Config`, their tensors renamed to the in-memory names, and every name, shape and the `d2t`/`t2d` maps are
checked *before* the head is built, so a bad checkpoint raises `CheckpointFormatError` and nothing is half-loaded.
Dialects: `"eagle"` (official SafeAILab), `"sglang"` (SGLang / SpecForge), `"modelopt"` (NVIDIA ModelOpt export,
read only) and `"speculators"` (vLLM speculators).

Layer ids: `Eagle3Config.target_layer_ids` use the EAGLE / HF `hidden_states` convention (id `k` = the hidden state
entering decoder layer `k`). vLLM and speculators read a top-level `eagle_aux_hidden_state_layer_ids` in that
convention. SGLang, SpecForge and ModelOpt keep `eagle_config.eagle_aux_hidden_state_layer_ids` as 0-based layer
*outputs* (SGLang captures `id + 1`, ModelOpt hooks the output of layer `id`): one less for the same layer.
"""

import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import fields

import torch
import transformers
from accelerate import init_empty_weights
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..configuration_eagle3 import Eagle3Config, default_target_layer_ids
from ..vocab_maps import check_vocab_maps, t2d_from_d2t
from .files import (
    CheckpointFormatError,
    check_safetensors_headers,
    load_checkpoint_tensors,
    read_config_dict,
    read_pickled,
    read_tensor_names_of,
    resolve_checkpoint_folder,
    weight_files,
)


logger = logging.getLogger(__name__)

READABLE_DIALECTS = ("eagle3_hf", "eagle", "sglang", "modelopt", "speculators")
_HUB_KWARGS = ("revision", "cache_dir", "force_download", "token", "local_files_only")
# Stock `from_pretrained` switches that have nothing to select for a converted head (we always read safetensors
# first and unpickle `.bin` files with weights_only=True).
_IGNORED_KWARGS = ("trust_remote_code", "low_cpu_mem_usage", "use_safetensors", "weights_only")
_CONFIG_FIELDS = {f.name for f in fields(Eagle3Config)}
_LAYER_KEY = re.compile(r"^layers\.\d+\.")
# Switches of EAGLE-3 variants (EAGLE-3.1, speculators options) in the files of the dialects that write them.
VARIANT_SWITCHES = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# What each dialect's engine makes of them, as `Eagle3Config` fields (absent: the engine has no such switch).
# speculators' `norm_output` feeds norm(h) back between draft steps; SpecForge's (default true) is whether the
# logits are computed after the final norm at all.
DIALECT_SWITCHES = {
    "speculators": {
        "norm_before_residual": "norm_before_residual",
        "norm_before_fc": "norm_before_fc",
        "fc_norm": "fc_norm",
        "norm_output": "normed_feedback",
        "embed_requires_grad": "trained_embedding",
    },
    "sglang": {"fc_norm": "fc_norm", "norm_output": "norm_before_lm_head"},
}
# ModelOpt eagle_config switches -> the only value this head implements.
_MODELOPT_SWITCHES = {"use_aux_hidden_state": True, "use_last_layernorm": True, "use_mtp_layernorm": False}
# RoPE types whose frequencies read `original_max_position_embeddings` (transformers fills it from
# `max_position_embeddings` when absent, so it is pinned from the checkpoint's value before that can change).
_ORIGINAL_CONTEXT_ROPE = ("llama3", "yarn", "longrope")
# The Llama config fields a dialect's config.json carries for the draft layer (read and written as is).
LLAMA_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
    "initializer_range", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- detection
def detect_dialect(config: dict, tensor_names: Iterable[str], source: str = "config.json") -> str:
    """The dialect of a checkpoint from its `config.json` dict and tensor names, checked in this order:

    1. `model_type == "eagle3"` -> `"eagle3_hf"`;
    2. `speculators_config` present (and `speculators_model_type == "eagle3"`) -> `"speculators"`;
    3. EAGLE-1/2 (no `draft_vocab_size` and no `hidden_norm` tensor) -> rejected;
    4. a `layers.N.*` tensor -> `"modelopt"`;
    5. `midlayer.*` tensors and `"LlamaForCausalLMEagle3"` in `architectures` -> `"sglang"`;
    6. `midlayer.*` tensors and `draft_vocab_size` -> `"eagle"` (official SafeAILab).
    Anything else raises `CheckpointFormatError`.
    """
    if config.get("model_type") == "eagle3":
        return "eagle3_hf"
    if "speculators_config" in config:
        if config.get("speculators_model_type") != "eagle3":
            raise CheckpointFormatError(
                f"{source}: speculators_model_type={config.get('speculators_model_type')!r}; only 'eagle3' "
                "speculators are EAGLE-3 heads."
            )
        return "speculators"
    names = set(tensor_names)
    has_layers = any(_LAYER_KEY.match(name) for name in names)
    has_midlayer = any(name.startswith("midlayer.") for name in names)
    architectures = config.get("architectures") or []
    if (has_layers or has_midlayer) and "draft_vocab_size" not in config:
        if not any(name.endswith("hidden_norm.weight") for name in names):
            raise CheckpointFormatError(
                f"{source}: this is an EAGLE-1/EAGLE-2 checkpoint (no draft_vocab_size, no hidden_norm tensor); "
                "eagle3_hf reads EAGLE-3 heads only."
            )
    if has_layers:
        if "Eagle3DeepseekV2ForCausalLM" in architectures:
            raise CheckpointFormatError(f"{source}: DeepSeek-V2 (MLA) draft layers are not supported.")
        return "modelopt"
    if has_midlayer and "LlamaForCausalLMEagle3" in architectures:
        return "sglang"
    if has_midlayer and "draft_vocab_size" in config:
        return "eagle"
    raise CheckpointFormatError(
        f"{source}: not an EAGLE-3 checkpoint in any known dialect. Expected model_type 'eagle3' (eagle3_hf), a "
        "speculators_config (vLLM speculators), layers.N.* tensors (ModelOpt), or midlayer.* tensors with "
        "architectures ['LlamaForCausalLMEagle3'] (SGLang) or a draft_vocab_size (official EAGLE)."
    )


def detect_checkpoint_dialect(path_or_repo_id: str | os.PathLike, **hub_kwargs) -> str:
    """`detect_dialect` on a folder or Hub repo (reads safetensors headers only)."""
    folder = resolve_checkpoint_folder(path_or_repo_id, **hub_kwargs)
    config = read_config_dict(folder)
    if config.get("model_type") == "eagle3":
        return "eagle3_hf"
    files = weight_files(folder)
    names = [n for f in files for n in (read_tensor_names_of(f) if f.suffix == ".safetensors" else read_pickled(f))]
    return detect_dialect(config, names, source=str(folder / "config.json"))


# ------------------------------------------------------------------------------------------------------- config
def config_from_dialect(
    raw: dict,
    dialect: str,
    source: str = "config.json",
    target_max_position_embeddings: int | None = None,
    **overrides,
) -> Eagle3Config:
    """An `Eagle3Config` from a foreign `config.json` dict; a bad field raises `CheckpointFormatError` naming it.

    RoPE base: `rope_theta` (or `rope_parameters.rope_theta`) when given, else 10000, never the target's. Layer
    ids: `overrides["target_layer_ids"]`, else those the config records (see the module docstring), else
    `[2, L//2, L-3]` from `target_num_hidden_layers` (override, recorded field, or the verifier's config when its
    name is known and resolvable); `CheckpointFormatError` when none of these is available.
    `max_position_embeddings`: the file's, replaced by `target_max_position_embeddings` (the target's context; the
    official 2048 is a placeholder) only for default, linear, proportional and Llama-3 RoPE, whose frequencies do
    not depend on it (`rope_reads_max_position_embeddings`); Llama-3 / YaRN / LongRoPE get
    `original_max_position_embeddings` pinned from the file's value. An explicit
    `overrides["max_position_embeddings"]` is applied as given.
    """
    layer = raw.get("transformer_layer_config") if dialect == "speculators" else raw
    where = "transformer_layer_config." if dialect == "speculators" else ""
    if not isinstance(layer, dict):
        raise CheckpointFormatError(f"{source}: missing transformer_layer_config (speculators dialect).")
    _check_variant_switches(raw, layer, dialect, source)
    variant = _variant_fields(raw, layer, dialect, source)
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if layer.get(key) is None:
            raise CheckpointFormatError(f"{source}: missing required field {where}{key}.")
        _check_count(layer[key], where + key, source)
    if layer.get("tie_word_embeddings"):
        raise CheckpointFormatError(f"{source}: tie_word_embeddings=true; the draft lm_head must be its own.")
    fields_ = {key: layer[key] for key in LLAMA_KEYS if layer.get(key) is not None}
    fields_.setdefault("num_hidden_layers", 1)
    if dialect == "eagle":  # the official code derives head_dim = H / nH and ignores the key
        fields_["head_dim"] = layer["hidden_size"] // layer["num_attention_heads"]
    if dialect == "eagle":
        rope = fields_["rope_parameters"] = _official_rope_parameters(layer, source)
    else:
        rope = fields_["rope_parameters"] = _rope_parameters(layer, where, source)
    if target_max_position_embeddings is not None:
        # YaRN / LongRoPE keep theirs too: it is the scaled context transformers checks against their factor.
        if rope["rope_type"] in ("yarn", "longrope") or rope_reads_max_position_embeddings(rope):
            logger.info(
                "%s: keeping %smax_position_embeddings=%s, not the target's %s, for its %r RoPE.", source, where,
                fields_.get("max_position_embeddings"), target_max_position_embeddings, rope["rope_type"],
            )  # fmt: skip
        else:
            fields_["max_position_embeddings"] = target_max_position_embeddings
    fields_["draft_vocab_size"] = raw.get("draft_vocab_size") or layer["vocab_size"]
    fields_["target_hidden_size"] = raw.get("target_hidden_size") or layer["hidden_size"]
    fields_["tie_word_embeddings"] = False
    fields_.update(variant)
    name = overrides.pop("target_model_name_or_path", None) or _verifier_name(raw, source)
    fields_["target_model_name_or_path"] = name
    ids = overrides.pop("target_layer_ids", None) or _recorded_layer_ids(raw, dialect, source)
    num_layers = overrides.pop("target_num_hidden_layers", None) or raw.get("target_num_hidden_layers")
    if ids is None:
        num_layers = num_layers or _layer_count_of(name)
        if num_layers is None:
            raise CheckpointFormatError(
                f"{source}: records neither the target layer ids (eagle_aux_hidden_state_layer_ids) nor the "
                "target's layer count L, so EAGLE-3's default taps [2, L//2, L-3] are unknown. Pass target=<target "
                "model>, target_num_hidden_layers=L or target_layer_ids=[...] (CLI: --target, "
                "--target-num-hidden-layers, --target-layer-ids)."
            )
        _check_count(num_layers, "target_num_hidden_layers", source)
    try:
        ids = list(ids) if ids is not None else default_target_layer_ids(num_layers)
        fields_.update(target_layer_ids=ids, target_num_hidden_layers=num_layers, **overrides)
        return Eagle3Config(**fields_)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as error:  # strict field types, RoPE keys
        raise CheckpointFormatError(f"{source}: {_one_line(error)}") from error


def rope_reads_max_position_embeddings(rope_parameters: dict | None) -> bool:
    """Whether transformers computes this RoPE's frequencies from `max_position_embeddings` itself.

    Dynamic NTK rescales beyond it; Llama-3, YaRN and LongRoPE read it only where `original_max_position_embeddings`
    (filled from it when absent) or `factor` is missing; default, linear and proportional never do. Unknown types
    count as reading it. For such a head the value is part of what the weights mean: the official 2048 placeholder
    must then be kept, not replaced by the target's context.
    """
    rope = rope_parameters or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type in ("default", "linear", "proportional"):
        return False
    if rope_type in _ORIGINAL_CONTEXT_ROPE:
        return rope.get("original_max_position_embeddings") is None or rope.get("factor") is None
    return True


def _rope_parameters(layer: dict, where: str, source: str) -> dict:
    """transformers-5 `rope_parameters` from `rope_theta` / `rope_scaling` / `rope_parameters` (base 10000 default),
    with `original_max_position_embeddings` pinned from the file's `max_position_embeddings` where it is read."""
    key = "rope_scaling" if layer.get("rope_scaling") else "rope_parameters"
    params = _object_field(layer, "rope_parameters", source, where)
    scaling = _object_field(layer, "rope_scaling", source, where)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or params.get("rope_type") or "default"
    scaling.pop("type", None)
    if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
        raise CheckpointFormatError(
            f"{source}: {where}{key} has rope_type={rope_type!r}, which transformers does not implement (known: "
            f"default, {', '.join(ROPE_INIT_FUNCTIONS)})."
        )
    theta = layer.get("rope_theta") or params.get("rope_theta") or 10000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise CheckpointFormatError(f"{source}: {where}rope_theta={theta!r} is not a number.")
    rope = {**params, **scaling, "rope_type": rope_type, "rope_theta": float(theta)}
    if rope_type in _ORIGINAL_CONTEXT_ROPE and rope.get("original_max_position_embeddings") is None:
        context = layer.get("max_position_embeddings") or Eagle3Config.max_position_embeddings
        rope["original_max_position_embeddings"] = context
    return rope


def _object_field(mapping: dict, key: str, source: str, where: str = "") -> dict:
    """A copy of the JSON object `mapping[key]`, `{}` when absent or null; anything else raises naming the field."""
    value = mapping.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointFormatError(
            f"{source}: {where}{key} must be a JSON object or null, not {type(value).__name__} {value!r}."
        )
    return dict(value)


def _check_count(value, field: str, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointFormatError(f"{source}: {field}={value!r} is not a positive integer.")


def _one_line(error: Exception) -> str:
    """An exception's message on one line (a `KeyError`'s without the quotes `str` adds)."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    return " ".join(str(message).split())


def _official_rope_parameters(layer: dict, source: str) -> dict:
    """RoPE as the official code computes it (eagle/model/cnets.py `_init_rope`, configs.py `EConfig`).

    Without `rope_scaling`: base `rope_theta`, or 10000 when absent. With it: `linear` or `dynamic` scaling by
    `factor` at base **10000**, whatever `rope_theta` says (the official code does not pass it on then).
    """
    scaling = _object_field(layer, "rope_scaling", source)
    if not scaling:
        return _rope_parameters(layer, "", source)
    rope_type = scaling.get("type") or scaling.get("rope_type")
    factor = scaling.get("factor")
    if rope_type not in ("linear", "dynamic") or isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise CheckpointFormatError(
            f"{source}: rope_scaling={scaling}; the official EAGLE code implements only {{'type': 'linear' or "
            "'dynamic', 'factor': <float>}."
        )
    theta = layer.get("rope_theta")
    if theta not in (None, 10000, 10000.0):
        logger.warning(
            "%s: rope_theta=%s is ignored, as the official EAGLE code ignores it when rope_scaling is set (base "
            "10000).", source, theta,
        )  # fmt: skip
    return {"rope_type": rope_type, "factor": float(factor), "rope_theta": 10000.0}


def _variant_fields(raw: dict, layer: dict, dialect: str, source: str) -> dict:
    """The `Eagle3Config` fields of the variant switches and sliding-window layers, read as `dialect`'s engine does.

    speculators and SGLang/SpecForge switches map through `DIALECT_SWITCHES`; a switch another dialect's engine
    does not have, set to true, is refused (silently ignoring it would change the head). speculators' sliding
    layers come from `transformer_layer_config.layer_types` and `.sliding_window` (as its model reads them;
    `use_sliding_window` is not read); other dialects' engines read no sliding layers.
    """
    known = DIALECT_SWITCHES.get(dialect, {})
    fields_ = {}
    for key in (*VARIANT_SWITCHES, "embed_requires_grad"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise CheckpointFormatError(f"{source}: {key}={value!r} is not true/false.")
        if key in known:
            fields_[known[key]] = value
        elif value:
            readers = sorted(d for d, switches in DIALECT_SWITCHES.items() if key in switches)
            raise CheckpointFormatError(
                f"{source}: {key}=true, but the {dialect} dialect's engine has no such switch (it is read from "
                f"{' and '.join(readers) or 'no'} checkpoints)."
            )
    where = "transformer_layer_config." if dialect == "speculators" else ""
    kinds = layer.get("layer_types")
    if kinds is not None:
        if not (isinstance(kinds, list) and all(isinstance(kind, str) for kind in kinds)):
            raise CheckpointFormatError(f"{source}: {where}layer_types={kinds!r} is not a list of strings.")
        if "sliding_attention" in kinds and dialect != "speculators":
            raise CheckpointFormatError(
                f"{source}: layer_types has sliding_attention layers, which the {dialect} dialect's engine does not "
                "read; only speculators heads have sliding-window draft layers."
            )
        if set(kinds) - {"full_attention"}:
            fields_["draft_layer_types"] = kinds
            fields_["draft_sliding_window"] = layer.get("sliding_window")
    return fields_


def _check_variant_switches(raw: dict, layer: dict, dialect: str, source: str) -> None:
    if dialect == "speculators" and layer.get("model_type", "llama") != "llama":
        raise CheckpointFormatError(
            f"{source}: transformer_layer_config.model_type={layer['model_type']!r}; only Llama draft layers are "
            "supported (Qwen3 layers carry extra q/k norms)."
        )
    if dialect == "modelopt":
        eagle_config = _object_field(raw, "eagle_config", source)
        for key, supported in _MODELOPT_SWITCHES.items():
            if eagle_config.get(key, supported) != supported:
                raise CheckpointFormatError(f"{source}: eagle_config.{key}={eagle_config[key]!r} is not supported.")
        if (eagle_config.get("parallel_draft_step") or 1) != 1:
            raise CheckpointFormatError(
                f"{source}: eagle_config.parallel_draft_step={eagle_config['parallel_draft_step']!r} is not "
                "supported (only 1)."
            )


def _recorded_layer_ids(raw: dict, dialect: str, source: str) -> list[int] | None:
    """Layer ids in the EAGLE convention from `eagle_aux_hidden_state_layer_ids` (top level, as vLLM reads it) or
    `eagle_config.eagle_aux_hidden_state_layer_ids` (0-based layer outputs, as SGLang/SpecForge/ModelOpt write it)."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = _object_field(raw, "eagle_config", source).get("eagle_aux_hidden_state_layer_ids")
    for key, ids in (("", top), ("eagle_config.", nested)):
        if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
            raise CheckpointFormatError(
                f"{source}: {key}eagle_aux_hidden_state_layer_ids={ids!r} is not a list of layer ids (integers)."
            )
    if dialect == "speculators" or not nested:
        return list(top) if top else None
    shifted = [i + 1 for i in nested]
    if top and list(top) != shifted:
        raise CheckpointFormatError(
            f"{source}: eagle_aux_hidden_state_layer_ids={list(top)} (layer inputs) and eagle_config."
            f"eagle_aux_hidden_state_layer_ids={list(nested)} (0-based layer outputs) name different layers; pass "
            "target_layer_ids=[...] explicitly."
        )
    return shifted


def _verifier_name(raw: dict, source: str) -> str | None:
    speculators_config = _object_field(raw, "speculators_config", source)
    verifier = _object_field(speculators_config, "verifier", source, "speculators_config.")
    name = verifier.get("name_or_path") or raw.get("target_model_name_or_path")
    if name is not None and not isinstance(name, str):
        raise CheckpointFormatError(f"{source}: the verifier name {name!r} is not a string.")
    return name


def _layer_count_of(name: str | None) -> int | None:
    """The verifier's layer count from its config (Hub or cache), or None when it cannot be read."""
    if name is None:
        return None
    try:
        return transformers.AutoConfig.from_pretrained(name).get_text_config().num_hidden_layers
    except (OSError, ValueError) as error:
        logger.info("Could not read the config of the verifier %r: %s", name, error)
        return None


# ------------------------------------------------------------------------------------------------------ tensors
def _native_tensors(
    tensors: dict[str, torch.Tensor], config: Eagle3Config, source: str, target: nn.Module | None
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Rename to in-memory names (`midlayer.` -> `layers.0.`), split off `embed_tokens.weight`, resolve `d2t`/`t2d`.

    Returns `(state_dict, embedding weight [vocab_size, hidden_size] or None)`.
    """
    state = {_in_memory_name(name): tensor for name, tensor in tensors.items()}
    # A trained embedding is part of the head's own weights; any other shipped one is the verifier's copy.
    embedding = None if config.trained_embedding else state.pop("embed_tokens.weight", None)
    if embedding is not None and tuple(embedding.shape) != (config.vocab_size, config.hidden_size):
        raise CheckpointFormatError(
            f"{source}: embed_tokens.weight has shape {tuple(embedding.shape)}; expected "
            f"(vocab_size={config.vocab_size}, hidden_size={config.hidden_size})."
        )
    state["d2t"], state["t2d"] = _vocab_maps(state.pop("d2t", None), state.pop("t2d", None), config, source)
    if "lm_head.weight" not in state:  # ModelOpt may leave the head on the target's lm_head
        if target is None or config.draft_vocab_size != config.vocab_size:
            raise CheckpointFormatError(
                f"{source}: no lm_head.weight. ModelOpt heads without their own lm_head use the target's; pass "
                "target=<the target model> (with draft_vocab_size == vocab_size) so it can be copied."
            )
        state["lm_head.weight"] = target.get_output_embeddings().weight.detach().to("cpu", copy=True)
    return state, embedding


def _in_memory_name(name: str) -> str:
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _checkpoint_name(name: str, dialect: str) -> str:
    """The name `name` (in-memory) has in a checkpoint of `dialect`, for error messages."""
    midlayer = dialect in ("eagle", "sglang") and name.startswith("layers.0.")
    return "midlayer." + name.removeprefix("layers.0.") if midlayer else name


def _vocab_maps(d2t, t2d, config: Eagle3Config, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked `(d2t int64 [V_d], t2d bool [V])`; identity when both are absent (V_d == V), the missing one rebuilt."""
    draft, full = config.draft_vocab_size, config.vocab_size
    if d2t is not None and (d2t.ndim != 1 or d2t.shape[0] != draft):
        raise CheckpointFormatError(
            f"{source}: d2t has shape {tuple(d2t.shape)} but config.json says draft_vocab_size={draft}."
        )
    if t2d is not None:
        t2d = t2d.to(torch.bool)
        if t2d.ndim != 1 or t2d.shape[0] != full:
            raise CheckpointFormatError(f"{source}: t2d has shape {tuple(t2d.shape)}; expected (vocab_size={full},).")
        if int(t2d.sum()) != draft:
            raise CheckpointFormatError(
                f"{source}: t2d marks {int(t2d.sum())} target ids but config.json says draft_vocab_size={draft}."
            )
    if d2t is None and t2d is None:
        if draft != full:
            raise CheckpointFormatError(
                f"{source}: no d2t/t2d, but draft_vocab_size={draft} < vocab_size={full}: the draft->target map "
                "is missing."
            )
        d2t, t2d = torch.zeros(draft, dtype=torch.long), torch.ones(full, dtype=torch.bool)
    elif d2t is None:  # sorted draft vocab: draft id i is the i-th marked target id
        d2t = t2d.nonzero().flatten() - torch.arange(draft)
    if d2t.is_floating_point() and not bool((d2t == d2t.round()).all()):
        raise CheckpointFormatError(f"{source}: d2t ({d2t.dtype}) holds non-integer offsets; expected int64.")
    d2t = d2t.to(torch.long)
    target_ids = torch.arange(draft) + d2t
    if draft > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):  # checked first: t2d is rebuilt from it
        raise CheckpointFormatError(
            f"{source}: d2t does not map draft ids to strictly increasing target ids (the draft vocabulary must "
            "be sorted ascending)."
        )
    try:
        t2d = t2d_from_d2t(d2t, full) if t2d is None else t2d
        check_vocab_maps(d2t, t2d, draft, full)
    except ValueError as error:
        raise CheckpointFormatError(f"{source}: {error}") from error
    return d2t, t2d


def _check_tensors(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], dialect: str, source: str):
    missing = sorted(_checkpoint_name(k, dialect) for k in expected.keys() - state.keys())
    unexpected = sorted(_checkpoint_name(k, dialect) for k in state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointFormatError(
            f"{source}: the tensors do not match an EAGLE-3 head with this config: missing {missing}, "
            f"unexpected {unexpected}."
        )
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise CheckpointFormatError(
                f"{source}: {_checkpoint_name(key, dialect)} has shape {tuple(state[key].shape)}; the config implies "
                f"{tuple(shape)}."
            )


# ------------------------------------------------------------------------------------------------------ loading
def from_pretrained_any_dialect(
    cls, stock_from_pretrained: Callable, pretrained_model_name_or_path, *model_args, **kwargs
) -> transformers.PreTrainedModel | tuple[transformers.PreTrainedModel, dict]:
    """`Eagle3DraftModel.from_pretrained` for any dialect (see `Eagle3DraftModel.from_pretrained` for the kwargs).

    `stock_from_pretrained` is `PreTrainedModel.from_pretrained` bound to `cls`; native folders, and calls that
    pass `config=`, go through it, then get the same strict checks as converted heads.
    """
    target = kwargs.pop("target", None)
    if pretrained_model_name_or_path is None or kwargs.get("config") is not None:
        return _load_native(stock_from_pretrained, pretrained_model_name_or_path, target, model_args, kwargs)
    hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if kwargs.get(key) is not None}
    folder = resolve_checkpoint_folder(pretrained_model_name_or_path, kwargs.get("subfolder") or "", **hub_kwargs)
    raw = read_config_dict(folder)
    if raw.get("model_type") == "eagle3":
        check_safetensors_headers(folder)
        return _load_native(stock_from_pretrained, pretrained_model_name_or_path, target, model_args, kwargs)
    if model_args:
        raise TypeError(f"Positional model_args are only accepted for native eagle3 checkpoints, not {folder}.")
    files = weight_files(folder)
    source = str(files[0] if len(files) == 1 else folder)
    tensors = load_checkpoint_tensors(files)
    dialect = detect_dialect(raw, tensors, source=str(folder / "config.json"))
    want_info = kwargs.pop("output_loading_info", False)
    config_source = str(folder / "config.json")
    model = _load_converted(cls, raw, tensors, dialect, target, kwargs, config_source=config_source, source=source)
    model.config._name_or_path = str(pretrained_model_name_or_path)
    logger.info("Loaded %s as an EAGLE-3 head from the %r dialect.", pretrained_model_name_or_path, dialect)
    if want_info:  # nothing is ever missing or skipped: any such problem raised above
        return model, {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}
    return model


def _load_native(stock_from_pretrained: Callable, path, target, model_args: tuple, kwargs: dict):
    """The stock loader, made strict: any missing, unexpected or mismatched tensor raises."""
    want_info = kwargs.pop("output_loading_info", False)
    try:
        model, info = stock_from_pretrained(path, *model_args, output_loading_info=True, **kwargs)
    except (KeyError, StrictDataclassError) as error:  # a config.json field of the wrong type, RoPE keys missing
        raise CheckpointFormatError(f"{path}: invalid config.json ({_one_line(error)}).") from error
    except RuntimeError as error:  # Transformers 5.25 raises for tensors of another shape than config.json's
        if "mismatched" not in str(error):
            raise
        raise CheckpointFormatError(
            f"{path}: tensors of another shape than config.json gives them (the report above lists them): the "
            "config does not belong to these weights."
        ) from error
    problems = {key: sorted(value) for key, value in info.items() if value}
    if problems:
        raise CheckpointFormatError(f"{path}: the weights do not match the config: {problems}.")
    try:
        check_vocab_maps(model.d2t, model.t2d, model.config.draft_vocab_size, model.config.vocab_size)
    except ValueError as error:
        raise CheckpointFormatError(f"{path}: {error}") from error
    if target is not None:
        model.attach_target(target)
    return (model, info) if want_info else model


def _load_converted(
    cls, raw: dict, tensors: dict, dialect: str, target, kwargs: dict, config_source: str, source: str
) -> transformers.PreTrainedModel:
    """Convert config and tensors, check them, then build the head; `kwargs` are the remaining caller kwargs."""
    dtype, legacy_dtype = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)
    dtype = dtype or legacy_dtype or "auto"
    device = _device_of(kwargs.pop("device_map", None))
    attn_implementation = kwargs.pop("attn_implementation", None)
    for key in (*_HUB_KWARGS, *_IGNORED_KWARGS, "subfolder"):
        kwargs.pop(key, None)
    if kwargs.pop("ignore_mismatched_sizes", False):
        raise ValueError("ignore_mismatched_sizes=True is not supported: a head with resized tensors is not the head.")
    if unknown := sorted(kwargs.keys() - _CONFIG_FIELDS):
        raise TypeError(f"Unexpected keyword arguments for Eagle3DraftModel.from_pretrained: {unknown}.")
    if dialect == "eagle" and "embed_tokens.weight" in tensors:
        # The official loader (load_state_dict(strict=False) after copying the target's) keeps a shipped one.
        kwargs.setdefault("trained_embedding", True)
    context = None
    if target is not None:
        text = target.config.get_text_config()
        kwargs.setdefault("target_num_hidden_layers", text.num_hidden_layers)
        if not _verifier_name(raw, config_source):  # a recorded verifier id (often a Hub id) beats a local path
            kwargs.setdefault("target_model_name_or_path", target.name_or_path or None)
        # The official drafts carry the 2048 placeholder; the target's context is the one the head serves (unless
        # the head's RoPE reads the value: config_from_dialect keeps it then).
        context = text.max_position_embeddings
    config = config_from_dialect(raw, dialect, config_source, context, **kwargs)
    state, embedding = _native_tensors(tensors, config, source, target)
    model = _build_and_load(cls, config, state, dialect, dtype, attn_implementation, source)
    if embedding is not None:  # the verifier's, shipped by speculators (and SpecForge --to hf): frozen
        weight = embedding.to(model.fc.weight.dtype)
        model.set_input_embeddings(nn.Embedding.from_pretrained(weight, freeze=True).to(device))
    model.to(device).eval()
    if target is not None:
        model.attach_target(target)
    return model


def _build_and_load(cls, config, state, dialect: str, dtype, attn_implementation, source: str):
    """Build the head with meta parameters, check every tensor against it, then assign them (strict)."""
    if dtype == "auto":  # the checkpoint's own floating dtype
        dtype = state["fc.weight"].dtype if "fc.weight" in state else torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with init_empty_weights(include_buffers=False):  # real RoPE buffers, meta parameters: no random init
        model = cls._from_config(config, dtype=dtype, **extra)
    _check_tensors(state, {k: v.shape for k, v in model.state_dict().items()}, dialect, source)
    state = {k: t.to(dtype) if t.is_floating_point() else t for k, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model


def _device_of(device_map) -> torch.device:
    """One device for the whole (small) head: a device, `{"": device}`, `"auto"` (the accelerator if any) or None."""
    if isinstance(device_map, dict):
        if set(device_map) != {""}:
            raise ValueError(f"device_map={device_map}: a draft head is placed whole; pass one device.")
        device_map = device_map[""]
    if device_map == "auto":
        accelerator = torch.accelerator.current_accelerator()
        return accelerator if accelerator is not None else torch.device("cpu")
    return torch.device("cpu" if device_map is None else device_map)


__all__ = [
    "LLAMA_KEYS",
    "READABLE_DIALECTS",
    "DIALECT_SWITCHES",
    "VARIANT_SWITCHES",
    "config_from_dialect",
    "detect_checkpoint_dialect",
    "detect_dialect",
    "from_pretrained_any_dialect",
    "rope_reads_max_position_embeddings",
]
