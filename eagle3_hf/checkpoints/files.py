"""The files of a checkpoint folder: where it is (local or Hub), its `config.json` and its weight files.

Every reader of a head goes through these, so a missing, truncated or inconsistent file raises
`CheckpointFormatError` naming the file before anything is built.
"""

import json
import logging
import os
import pickle
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from safetensors import SafetensorError, safe_open


logger = logging.getLogger(__name__)


class CheckpointFormatError(ValueError):
    """A checkpoint is in no known dialect, or its files, config fields or tensors are inconsistent."""


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
        part = _read_safetensors(file) if file.suffix == ".safetensors" else read_pickled(file)
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


def read_pickled(file: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError) as error:
        raise CheckpointFormatError(f"{file}: unreadable PyTorch file ({error}).") from error
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointFormatError(f"{file}: expected a flat state dict (tensor name -> tensor).")
    return state


def check_safetensors_headers(folder: Path) -> None:
    """Open every safetensors header so a truncated file is reported by name before the stock loader runs."""
    for file in sorted(folder.glob("*.safetensors")):
        read_tensor_names_of(file)


def read_tensor_names_of(file: Path) -> list[str]:
    try:
        with safe_open(file, framework="pt") as reader:
            return list(reader.keys())
    except (SafetensorError, OSError) as error:
        raise CheckpointFormatError(f"{file}: unreadable safetensors file ({error}); is it truncated?") from error


__all__ = [
    "CheckpointFormatError",
    "check_safetensors_headers",
    "load_checkpoint_tensors",
    "read_config_dict",
    "read_pickled",
    "read_tensor_names_of",
    "resolve_checkpoint_folder",
    "weight_files",
]
