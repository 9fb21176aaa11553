"""Read and write every EAGLE-3 checkpoint dialect (user guide: docs/checkpoint-dialects.md).

Reading: `Eagle3DraftModel.from_pretrained` calls `from_pretrained_any_dialect`. Native folders (`model_type:
"eagle3"`) go through the stock Transformers loader; the others are detected (`detect_dialect`), their config is
converted to an `Eagle3Config`, their tensors renamed to the in-memory names, and every name, shape and the
`d2t`/`t2d` maps are checked *before* the head is built, so a bad checkpoint raises `CheckpointFormatError` and
nothing is half-loaded. Dialects: `"eagle"` (official SafeAILab), `"sglang"` (SGLang / SpecForge), `"modelopt"`
(NVIDIA ModelOpt export, read only) and `"speculators"` (vLLM speculators).

Writing: `save_in_dialect(model, directory, dialect)` for `"eagle3_hf"` (`save_pretrained`), `"eagle"`, `"sglang"`
and `"speculators"`, staged in a hidden temporary folder next to the destination and renamed into place at the end.

Layer ids: `Eagle3Config.target_layer_ids` use the EAGLE / HF `hidden_states` convention (id `k` = the hidden state
entering decoder layer `k`). vLLM and speculators read a top-level `eagle_aux_hidden_state_layer_ids` in that
convention. SGLang, SpecForge and ModelOpt keep `eagle_config.eagle_aux_hidden_state_layer_ids` as 0-based layer
*outputs* (SGLang captures `id + 1`, ModelOpt hooks the output of layer `id`): one less for the same layer.
"""

import json
import logging
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import torch
import transformers
from accelerate import init_empty_weights
from huggingface_hub import snapshot_download
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_eagle3 import Eagle3Config, default_target_layer_ids
from .vocab import check_vocab_maps, t2d_from_d2t


logger = logging.getLogger(__name__)

READABLE_DIALECTS = ("eagle3_hf", "eagle", "sglang", "modelopt", "speculators")
WRITABLE_DIALECTS = ("eagle3_hf", "eagle", "sglang", "speculators")
ARCHITECTURES = {"eagle": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle3", "speculators": "Eagle3Speculator"}
SPECULATORS_VERSION = "0.3.0"

_HUB_KWARGS = ("revision", "cache_dir", "force_download", "token", "local_files_only")
# Stock `from_pretrained` switches that have nothing to select for a converted head (we always read safetensors
# first and unpickle `.bin` files with weights_only=True).
_IGNORED_KWARGS = ("trust_remote_code", "low_cpu_mem_usage", "use_safetensors", "weights_only")
_CONFIG_FIELDS = {f.name for f in fields(Eagle3Config)}
_LAYER_KEY = re.compile(r"^layers\.\d+\.")
# Switches of EAGLE-3 variants (EAGLE-3.1, speculators options) whose extra norms this head does not have.
_VARIANT_SWITCHES = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# ModelOpt eagle_config switches -> the only value this head implements.
_MODELOPT_SWITCHES = {"use_aux_hidden_state": True, "use_last_layernorm": True, "use_mtp_layernorm": False}
# RoPE types whose frequencies read `original_max_position_embeddings` (transformers fills it from
# `max_position_embeddings` when absent, so it is pinned from the checkpoint's value before that can change).
_ORIGINAL_CONTEXT_ROPE = ("llama3", "yarn", "longrope")
_LLAMA_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
    "initializer_range", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
)  # fmt: skip


class CheckpointFormatError(ValueError):
    """A checkpoint is in no known dialect, or its files, config fields or tensors are inconsistent."""


# ------------------------------------------------------------------------------------------------ files and hub
def resolve_checkpoint_folder(path_or_repo_id: str | os.PathLike, subfolder: str = "", **hub_kwargs) -> Path:
    """A local folder as is, or a Hub repo fetched into the normal huggingface_hub cache.

    Only `config.json` and weight files (`*.safetensors`, the safetensors index, `pytorch_model.bin`) are fetched.
    `hub_kwargs`: `revision`, `cache_dir`, `force_download`, `token`, `local_files_only`.
    """
    if Path(path_or_repo_id).is_dir():
        return Path(path_or_repo_id, subfolder)
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    patterns = [prefix + name for name in ("config.json", "*.safetensors", "*.safetensors.index.json")]
    patterns.append(prefix + "pytorch_model.bin")
    try:
        folder = snapshot_download(str(path_or_repo_id), allow_patterns=patterns, **hub_kwargs)
    except (OSError, ValueError) as error:  # offline and not cached, unknown repo, invalid id, gated...
        message = f"{str(path_or_repo_id)!r} is not a local folder and could not be fetched from the Hub: {error}"
        raise OSError(message) from error
    return Path(folder, subfolder)


def read_config_dict(folder: Path) -> dict:
    """The parsed `config.json` of a checkpoint folder."""
    file = Path(folder, "config.json")
    if not file.is_file():
        raise CheckpointFormatError(f"{folder}: no config.json; every EAGLE-3 checkpoint dialect has one.")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointFormatError(f"{file}: not valid JSON ({error}).") from error
    if not isinstance(config, dict):
        raise CheckpointFormatError(f"{file}: expected a JSON object, found {type(config).__name__}.")
    return config


def weight_files(folder: Path) -> list[Path]:
    """The weight files, by preference: `model.safetensors`, a sharded safetensors index, `pytorch_model.bin`.

    A folder that also holds `pytorch_model.bin` logs a warning: the official EAGLE loader reads that one instead.
    """
    pickled = folder / "pytorch_model.bin"
    index = folder / "model.safetensors.index.json"
    for chosen in (folder / "model.safetensors", index):
        if chosen.is_file() and pickled.is_file():
            logger.warning(
                "%s holds both %s and %s; reading %s (the official EAGLE loader reads %s: make sure both hold the "
                "same head, or delete one).",
                folder,
                pickled.name,
                chosen.name,
                chosen.name,
                pickled.name,
            )
            break
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as error:
            raise CheckpointFormatError(f"{index}: no readable weight_map ({error!r}).") from error
        return [folder / shard for shard in shards]
    if pickled.is_file():
        return [pickled]
    raise CheckpointFormatError(
        f"{folder}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)."
    )


def load_checkpoint_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of the given weight files (CPU). Pickled `.bin` files are read with `weights_only=True`."""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        part = _read_safetensors(file) if file.suffix == ".safetensors" else _read_pickled(file)
        if duplicates := sorted(part.keys() & tensors.keys()):
            raise CheckpointFormatError(f"{file}: tensors {duplicates} also appear in another shard.")
        tensors.update(part)
    return tensors


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(file, framework="pt") as reader:
            return {name: reader.get_tensor(name) for name in reader.keys()}
    except (SafetensorError, OSError) as error:
        raise CheckpointFormatError(f"{file}: unreadable safetensors file ({error}); is it truncated?") from error


def _read_pickled(file: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError) as error:
        raise CheckpointFormatError(f"{file}: unreadable PyTorch file ({error}).") from error
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointFormatError(f"{file}: expected a flat state dict (tensor name -> tensor).")
    return state


def _check_safetensors_headers(folder: Path) -> None:
    """Open every safetensors header so a truncated file is reported by name before the stock loader runs."""
    for file in sorted(folder.glob("*.safetensors")):
        _read_header(file)


def _read_header(file: Path) -> list[str]:
    try:
        with safe_open(file, framework="pt") as reader:
            return list(reader.keys())
    except (SafetensorError, OSError) as error:
        raise CheckpointFormatError(f"{file}: unreadable safetensors file ({error}); is it truncated?") from error


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
    names = [n for f in files for n in (_read_header(f) if f.suffix == ".safetensors" else _read_pickled(f))]
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
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if layer.get(key) is None:
            raise CheckpointFormatError(f"{source}: missing required field {where}{key}.")
        _check_count(layer[key], where + key, source)
    if layer.get("tie_word_embeddings"):
        raise CheckpointFormatError(f"{source}: tie_word_embeddings=true; the draft lm_head must be its own.")
    fields_ = {key: layer[key] for key in _LLAMA_KEYS if layer.get(key) is not None}
    fields_.setdefault("num_hidden_layers", 1)
    if dialect == "eagle":  # the official code derives head_dim = H / nH and ignores the key
        fields_["head_dim"] = layer["hidden_size"] // layer["num_attention_heads"]
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


def _check_variant_switches(raw: dict, layer: dict, dialect: str, source: str) -> None:
    for key in _VARIANT_SWITCHES:
        if raw.get(key):
            raise CheckpointFormatError(
                f"{source}: {key}=true selects an EAGLE-3 variant eagle3_hf does not implement."
            )
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
    embedding = state.pop("embed_tokens.weight", None)
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
        _check_safetensors_headers(folder)
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
    if embedding is not None:  # shipped by speculators (and SpecForge --to hf): part of this head, frozen
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


# ------------------------------------------------------------------------------------------------------ writing
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
    with _atomic_directory(Path(save_directory), overwrite) as staging:
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
        return state, _speculators_config_dict(config, llama, speculative_tokens, verifier_architectures)
    if config.num_hidden_layers != 1:
        raise ValueError(
            f"num_hidden_layers={config.num_hidden_layers}: the {dialect} dialect stores exactly one layer "
            "('midlayer'); write 'speculators' or 'eagle3_hf' instead."
        )
    if config.attention_bias or config.mlp_bias:
        raise ValueError(f"The {dialect} dialect has no attention/MLP biases; this head has some.")
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
    return state, {
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


def _llama_config_dict(config: Eagle3Config, max_position_embeddings: int | None, dtype: torch.dtype) -> dict:
    """The Llama fields engines read, with RoPE as top-level `rope_theta` / `rope_scaling` (what they look for)."""
    rope = dict(config.rope_parameters or {})
    theta, rope_type = rope.pop("rope_theta", 10000.0), rope.pop("rope_type", "default")
    fields_ = {key: getattr(config, key) for key in _LLAMA_KEYS}
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
        **dict.fromkeys(_VARIANT_SWITCHES, False),
        "embed_requires_grad": False,
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


@contextmanager
def _atomic_directory(destination: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a hidden staging folder next to `destination`; rename it into place only if the body succeeds."""
    destination = destination.absolute()
    if destination.exists() and not destination.is_dir():
        raise FileExistsError(f"{destination} exists and is not a folder.")
    if destination.is_dir() and any(destination.iterdir()) and not overwrite:
        raise FileExistsError(f"{destination} exists and is not empty; pass overwrite=True (CLI: --overwrite).")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.partial-", dir=destination.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the result should look like any other folder
        yield staging
        previous = staging.with_name(staging.name.replace(".partial-", ".previous-")) if destination.exists() else None
        if previous is not None:
            destination.rename(previous)
        try:
            staging.rename(destination)
        except OSError:
            if previous is not None:
                previous.rename(destination)
            raise
        if previous is not None:
            shutil.rmtree(previous)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left when something failed


__all__ = [
    "ARCHITECTURES",
    "READABLE_DIALECTS",
    "WRITABLE_DIALECTS",
    "CheckpointFormatError",
    "config_from_dialect",
    "detect_checkpoint_dialect",
    "detect_dialect",
    "from_pretrained_any_dialect",
    "load_checkpoint_tensors",
    "read_config_dict",
    "resolve_checkpoint_folder",
    "rope_reads_max_position_embeddings",
    "save_in_dialect",
    "weight_files",
]
