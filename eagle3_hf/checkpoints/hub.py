"""Pushing a draft head to the Hugging Face Hub in the checkpoint format a serving engine reads, with its card.

`prepare_upload_folder` writes exactly what will be uploaded (config, weights, README.md) into a local folder;
`push_to_hub` does that in a temporary folder and uploads it with `HfApi.create_repo` + `HfApi.upload_folder`.
A card already on the Hub is updated, not replaced: text written there outside the generated sections is kept.
"""

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import CommitInfo, HfApi, ModelCard
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from ..configuration_eagle3 import Eagle3Config
from .model_card import create_or_update_model_card, merge_model_cards
from .writing import save_in_dialect


FORMATS = ("eagle3_hf", "sglang", "speculators", "eagle")
# SGLang's layout is the default: SGLang and vLLM both load it (checkpoint-formats.md §9).
DEFAULT_FORMAT = "sglang"
# Weight files of a previous push in another format are deleted in the same commit, so that a loader never picks
# a stale file (the official EAGLE loader prefers pytorch_model.bin over model.safetensors, for instance).
STALE_FILE_PATTERNS = ["model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json"]


def prepare_upload_folder(
    model_or_folder: Any,
    folder: str | os.PathLike,
    format: str = DEFAULT_FORMAT,
    *,
    repo_id: str | None = None,
    target: Any = None,
    base_card: str | os.PathLike | None = None,
    training: dict | None = None,
    results: dict | Sequence[dict] | None = None,
    dataset_names: Sequence[str] | None = None,
    license: str | None = None,
    tags: Sequence[str] = (),
) -> list[str]:
    """Write the files to upload into `folder` (created; must be empty) and return their sorted relative paths.

    Args:
        model_or_folder (`Eagle3DraftModel`, `str` or `os.PathLike`): the head, or a checkpoint folder of any
            dialect (loaded with `Eagle3DraftModel.from_pretrained`; its README.md is carried over and updated).
        folder (`str` or `os.PathLike`): where to write; must not exist or be empty.
        format (`str`, defaults to `"sglang"`): one of `FORMATS`, the checkpoint dialect written by
            `eagle3_hf.checkpoints.writing.save_in_dialect`.
        repo_id (`str`, *optional*): the Hub id, used in the card's usage snippets.
        target (`PreTrainedModel`, *optional*): the target; its embedding is attached to a head that has none,
            which the `"speculators"` format needs (it ships the verifier's embedding).
        base_card (`str` or `os.PathLike`, *optional*): a README.md to update instead (e.g. the one on the Hub);
            its text outside the generated sections and its metadata are kept.
        training, results, dataset_names, license, tags: passed to `create_or_update_model_card`.
    """
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: expected one of {FORMATS}.")
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise FileExistsError(f"folder={str(folder)!r} must be a new or empty directory: it becomes the upload.")
    model, source_card = _write_checkpoint(model_or_folder, folder, format, target)
    card_kwargs = dict(training=training, results=results, dataset_names=dataset_names, license=license, tags=tags)
    _write_card(folder, model, source_card, format, repo_id=repo_id, base_card=base_card, **card_kwargs)
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def _write_checkpoint(model_or_folder: Any, folder: Path, format: str, target: Any) -> tuple[Any, Path | None]:
    """Export the head into `folder` (refusals raise before anything is written); returns it and its source card."""
    model, source_card = _load_head(model_or_folder, target)
    save_in_dialect(model, folder, format)
    return model, source_card


def _write_card(
    folder: Path,
    model: Any,
    source_card: Path | None,
    format: str,
    *,
    repo_id: str | None,
    base_card: str | os.PathLike | None,
    license: str | None = None,
    **card_kwargs,
) -> None:
    """`folder/README.md`: the source card (if any) updated for `model`, then merged into `base_card` (if any)."""
    readme = folder / "README.md"
    if source_card is not None:
        shutil.copyfile(source_card, readme)  # replaces any card the save wrote: the source card has the history
    card = create_or_update_model_card(folder, model, license=license, format=format, repo_id=repo_id, **card_kwargs)
    if base_card is not None:
        base = ModelCard.load(base_card)
        if license is None and base.data.license:  # the base card's license stands unless one is passed
            card.data.license = None
        merge_model_cards(base, card, format=format).save(readme)


def push_to_hub(
    model_or_folder: Any,
    repo_id: str,
    *,
    format: str = DEFAULT_FORMAT,
    private: bool | None = None,
    token: str | bool | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    **card_kwargs,
) -> CommitInfo:
    """Upload a head (or a checkpoint folder) to `repo_id` in `format`, with an up-to-date model card.

    Writes the checkpoint first (a head the format refuses creates no repository or branch), then creates the
    repository if needed (`private` applies only then), merges the card already on the Hub into the new one (as
    `prepare_upload_folder` does) and commits the folder with `HfApi.upload_folder`, deleting weight files of a
    previous push in another format (`STALE_FILE_PATTERNS`). `card_kwargs` are `target` (see
    `prepare_upload_folder`), `training`, `results`, `dataset_names`, `license` and `tags` (see
    `create_or_update_model_card`). Returns the `CommitInfo`.

    Needs the network and a token with write access (`hf auth login` or `token=`); with `HF_HUB_OFFLINE=1`
    `huggingface_hub` refuses the first request.
    """
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: expected one of {FORMATS}.")
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="eagle3_hf-push-") as tmp:
        upload = Path(tmp) / "upload"
        model, source_card = _write_checkpoint(model_or_folder, upload, format, card_kwargs.pop("target", None))
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
        if revision is not None and not revision.startswith("refs/pr"):
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        remote_card = _download_card(api, repo_id, revision, Path(tmp) / "remote")
        _write_card(upload, model, source_card, format, repo_id=repo_id, base_card=remote_card, **card_kwargs)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=upload,
            repo_type="model",
            commit_message=commit_message or f"Upload EAGLE-3 draft head ({format} format)",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
            delete_patterns=STALE_FILE_PATTERNS,
        )


def _load_head(model_or_folder: Any, target: Any) -> tuple[Any, Path | None]:
    """The head to save (with `target`'s embedding if it has none) and the README.md that comes with it."""
    # The head's class as `import eagle3_hf` registered it with AutoModel: importing modeling_eagle3 here would make
    # it and this module (which its push_to_hub calls) import each other.
    head_class = MODEL_MAPPING[Eagle3Config]
    if isinstance(model_or_folder, head_class):
        if target is not None and not model_or_folder.has_embedding:
            model_or_folder.attach_target(target)
        return model_or_folder, None
    if not isinstance(model_or_folder, (str, os.PathLike)) or not Path(model_or_folder).is_dir():
        raise ValueError(
            f"model_or_folder={model_or_folder!r}: expected an Eagle3DraftModel or a local checkpoint folder."
        )
    folder = Path(model_or_folder)
    readme = folder / "README.md"
    return head_class.from_pretrained(folder, target=target), readme if readme.is_file() else None


def _download_card(api: HfApi, repo_id: str, revision: str | None, local_dir: Path) -> Path | None:
    """The README.md on the Hub, downloaded into `local_dir`, or `None` for a repository without one."""
    if not api.file_exists(repo_id, "README.md", repo_type="model", revision=revision):
        return None
    return Path(api.hf_hub_download(repo_id, "README.md", repo_type="model", revision=revision, local_dir=local_dir))


__all__ = ["DEFAULT_FORMAT", "FORMATS", "STALE_FILE_PATTERNS", "prepare_upload_folder", "push_to_hub"]
