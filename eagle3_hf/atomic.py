"""Atomic writes: a file or a folder appears whole under its name, or not at all.

Interrupted jobs (a killed conversion, a full disk while caching features) must never leave a file that a later
run reads as complete. Everything is written under a hidden name next to the destination (same file system) and
renamed over it at the end; `os.replace` / `Path.rename` are atomic there.
"""

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import safetensors.torch
import torch


def _partial_path(path: Path) -> Path:
    """A hidden, unique name next to `path` (unique per writer, so concurrent processes do not collide)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def save_safetensors_atomically(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file(tensors, path, metadata)`, renamed into place only once complete."""
    path = Path(path)
    partial = _partial_path(path)
    try:
        safetensors.torch.save_file(tensors, str(partial), metadata=metadata)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # only left when something failed


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """`text` (UTF-8) in `path`, renamed into place only once complete."""
    path = Path(path)
    partial = _partial_path(path)
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # only left when something failed


def write_json_atomically(path: str | os.PathLike, payload: dict) -> None:
    """`payload` as indented, key-sorted JSON in `path`, renamed into place only once complete."""
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


@contextmanager
def atomic_directory(destination: Path, overwrite: bool) -> Iterator[Path]:
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


__all__ = ["atomic_directory", "save_safetensors_atomically", "write_json_atomically", "write_text_atomically"]
