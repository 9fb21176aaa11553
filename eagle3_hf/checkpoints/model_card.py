"""Model cards (README.md) for EAGLE-3 draft heads, generated from `templates/model_card.md`.

The card is written on every save, after training and after benchmarking, and updated in place: only the sections
between `<!-- eagle3_hf:begin NAME -->` and `<!-- eagle3_hf:end NAME -->` are rewritten, and only the metadata keys
this module owns (`library_name`, `base_model`, `pipeline_tag`, our tags); everything else a user wrote is kept, and
updating twice with the same inputs gives byte-identical files. A section rendered without data (training,
results) never replaces one that has data, so a plain save keeps the numbers a benchmark wrote earlier.
"""

import importlib.metadata
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import ModelCard, ModelCardData

from ..configuration_eagle3 import Eagle3Config


TEMPLATE_PATH = Path(__file__).parent / "templates" / "model_card.md"
LIBRARY_NAME = "eagle3_hf"
PIPELINE_TAG = "text-generation"
DEFAULT_LICENSE = "apache-2.0"
BASE_TAGS = ("eagle3", "eagle3_hf", "speculative-decoding")
# Tags that describe the checkpoint format; the ones of other formats are dropped when a card changes format.
FORMAT_TAGS = {
    "eagle3_hf": (),
    "sglang": ("sglang",),
    "speculators": ("speculators", "vllm"),
    "eagle": (),
    "modelopt": (),
}
FORMAT_DESCRIPTIONS = {
    "eagle3_hf": "`eagle3_hf` native (`model_type: eagle3`, loads with `AutoModel` after `import eagle3_hf`)",
    "sglang": "SGLang / SpecForge (`LlamaForCausalLMEagle3`, `midlayer.*` keys), also read by vLLM",
    "speculators": "vLLM speculators (`Eagle3Speculator` with `speculators_config`)",
    "eagle": "official SafeAILab EAGLE (`LlamaForCausalLM`, `midlayer.*` keys), also read by vLLM",
    "modelopt": "NVIDIA ModelOpt export (`layers.N.*` keys)",
}
# Which serving engines load each format (checkpoint-formats.md §5): SGLang needs `LlamaForCausalLMEagle3`
# (sglang#8229) and cannot read speculators checkpoints (sglang#18216); vLLM maps `midlayer.` to `layers.0.`.
_SERVES_VLLM = {"sglang", "speculators", "eagle"}
_SERVES_SGLANG = {"sglang"}
_ENGINE_NOTES = {
    "eagle3_hf": "Serving engines do not read this native format: push it with `eagle3-hf push FOLDER REPO_ID "
    "--format sglang` (read by SGLang and vLLM) or `--format speculators` (vLLM).",
    "speculators": "SGLang does not read the speculators format: push with `--format sglang` for SGLang.",
    "eagle": "SGLang needs `LlamaForCausalLMEagle3` in `architectures`: push with `--format sglang` for SGLang.",
    "modelopt": "For SGLang and vLLM, push it with `eagle3-hf push FOLDER REPO_ID --format sglang`.",
}
EAGLE3_CITATION = """@misc{li2025eagle3scalinginferenceacceleration,
      title={{EAGLE-3}: Scaling up Inference Acceleration of Large Language Models via Training-Time Test},
      author={Yuhui Li and Fangyun Wei and Chao Zhang and Hongyang Zhang},
      year={2025},
      eprint={2503.01840},
      archivePrefix={arXiv},
      primaryClass={cs.CL},
      url={https://arxiv.org/abs/2503.01840},
}"""
# Training-recipe keys with their labels, in display order; other keys are shown after these, labelled by name.
TRAINING_LABELS = {
    "data": "Data",
    "num_conversations": "Conversations",
    "num_tokens": "Tokens",
    "epochs": "Epochs",
    "steps": "Optimizer steps",
    "batch_size": "Batch size",
    "learning_rate": "Learning rate",
    "max_length": "Sequence length",
    "ttt_steps": "Training-time-test steps",
    "draft_vocab_size": "Draft vocabulary",
    "precision": "Precision",
    "final_loss": "Final training loss",
    "wall_time": "Wall time",
    "machine": "Machine",
}
# Columns of the results table: key of a benchmark row (see `eagle3_hf.bench.measure.summarize`) -> header.
RESULT_COLUMNS = {
    "dataset": "Dataset",
    "temperature": "T",
    "method": "Method",
    "tau": "τ",
    "tokens_per_second": "Tokens/s",
    "speedup": "Speedup",
    "tree_round_share": "Tree rounds",
    "greedy_mismatches": "Greedy mismatches",
    "generations": "Generations",
}
FRAMEWORKS = ("eagle3_hf", "transformers", "torch", "huggingface_hub", "safetensors", "accelerate", "datasets")

_SECTION_RE = re.compile(r"<!-- eagle3_hf:begin (?P<name>\w+) -->\n.*?<!-- eagle3_hf:end (?P=name) -->", re.DOTALL)
_EMPTY_MARK = "<!-- eagle3_hf:empty -->"
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# ------------------------------------------------------------------------------------------------------ public API
def create_or_update_model_card(
    save_directory: str | os.PathLike,
    model: Any = None,
    *,
    training: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    dataset_names: Sequence[str] | None = None,
    license: str | None = None,
    format: str | None = None,
    repo_id: str | None = None,
    tags: Iterable[str] = (),
) -> ModelCard:
    """Create `save_directory/README.md`, or update the one there, and return the card.

    Args:
        save_directory (`str` or `os.PathLike`): folder of the checkpoint; its `README.md` is read and written.
        model (`Eagle3DraftModel` or `Eagle3Config`, *optional*): the head (or its config). Defaults to the
            config saved in `save_directory` (any dialect).
        training (`dict`, *optional*): the training recipe, e.g. `{"data": ..., "steps": ..., "max_length": ...,
            "ttt_steps": ..., "wall_time": seconds, "machine": ..., "command": ...}` (see `TRAINING_LABELS`; other
            keys are shown under their own name). `None` keeps the section already in the card.
        results (`dict` or list of `dict`, *optional*): benchmark runs, each the `results.json` written by
            `eagle3_hf.bench.report.write_report`: `{"machine": str, "command": str, "rows": [...]}`, rows with the
            keys of `RESULT_COLUMNS`. `None` keeps the section already in the card.
        dataset_names (`list[str]`, *optional*): training datasets; Hub ids go to the `datasets` metadata.
        license (`str`, *optional*): sets `license`; by default the card's own license is kept, else `apache-2.0`.
        format (`str`, *optional*): checkpoint format of the folder, which decides the serving commands shown;
            by default detected from the folder's files (`"eagle3_hf"` when it has no `config.json` yet).
        repo_id (`str`, *optional*): Hub id used in the usage snippets; defaults to `save_directory` as given.
        tags (`list[str]`, *optional*): extra tags merged into the metadata.
    """
    save_directory = Path(save_directory)
    config, num_parameters, format = _describe(model, save_directory, format)
    fresh = render_model_card(
        config,
        num_parameters=num_parameters,
        training=training,
        results=results,
        dataset_names=dataset_names,
        license=license,
        format=format,
        repo_id=repo_id or str(save_directory),
        tags=tags,
    )
    readme = save_directory / "README.md"
    existing = ModelCard.load(readme) if readme.is_file() else None
    card = merge_model_cards(existing, fresh, format=format)
    card.save(readme)
    return card


def write_model_card(
    save_directory: str | os.PathLike, model: Any = None, *, is_main_process: bool = True, **kwargs
) -> Path | None:
    """The save hook: `create_or_update_model_card` on the main process only; returns the README path (or `None`).

    Called by `Eagle3DraftModel.save_pretrained`, by the trainer at each checkpoint (with `training=`) and by the
    benchmark (with `results=`). `kwargs` are those of `create_or_update_model_card`.
    """
    if not is_main_process:
        return None
    create_or_update_model_card(save_directory, model, **kwargs)
    return Path(save_directory) / "README.md"


def render_model_card(
    config: Eagle3Config,
    *,
    num_parameters: int | None = None,
    training: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    dataset_names: Sequence[str] | None = None,
    license: str | None = None,
    format: str = "eagle3_hf",
    repo_id: str = "<draft-repo-id>",
    tags: Iterable[str] = (),
) -> ModelCard:
    """A fresh card from the template (no existing README involved). See `create_or_update_model_card`.

    The `license` metadata is left unset when `license` is `None`; `merge_model_cards` fills the default.
    """
    if format not in FORMAT_DESCRIPTIONS:
        raise ValueError(f"format={format!r}: expected one of {sorted(FORMAT_DESCRIPTIONS)}.")
    target = config.target_model_name_or_path
    card_data = {
        "base_model": target if _is_hub_id(target) else None,
        "datasets": sorted({name for name in dataset_names or () if _is_hub_id(name)}) or None,
        "library_name": LIBRARY_NAME,
        "license": license,
        "pipeline_tag": PIPELINE_TAG,
        "tags": sorted({*BASE_TAGS, *FORMAT_TAGS[format], *tags}),
    }
    training_rows, training_command = _training_rows(training, dataset_names)
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    text = environment.from_string(TEMPLATE_PATH.read_text(encoding="utf-8")).render(
        card_data=ModelCardData(**card_data).to_yaml(),
        target=target or "<target-model-id>",
        target_name=target or "its target model",
        target_link=_target_link(target),
        repo_id=repo_id,
        target_layer_ids=list(config.target_layer_ids),
        target_hidden_size=config.target_hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        draft_vocab_size=f"{config.draft_vocab_size:,}",
        vocab_size=f"{config.vocab_size:,}",
        num_parameters=_format_count(num_parameters) if num_parameters else None,
        format=format,
        format_description=FORMAT_DESCRIPTIONS[format],
        eagle3_hf_version=_version("eagle3_hf") or "",
        serves_vllm=format in _SERVES_VLLM,
        serves_sglang=format in _SERVES_SGLANG,
        engine_note=_ENGINE_NOTES.get(format),
        training_rows=training_rows,
        training_command=training_command,
        result_headers=list(RESULT_COLUMNS.values()),
        result_runs=_result_runs(results),
        framework_versions=[(name, v) for name in FRAMEWORKS if (v := _version(name))],
        citation=EAGLE3_CITATION,
    )
    return ModelCard(text)


def merge_model_cards(existing: ModelCard | None, fresh: ModelCard, *, format: str = "eagle3_hf") -> ModelCard:
    """`existing` updated with `fresh`'s generated sections and metadata; everything else in `existing` is kept.

    Body: each marked section of `existing` is replaced by `fresh`'s, except that a section rendered without data
    never replaces one with data; sections `existing` lacks are appended. Metadata: `library_name`,
    `pipeline_tag` and (when known) `base_model` are set; tags are merged and sorted (tags of other checkpoint
    formats are dropped); `datasets` and `license` are set when `fresh` has them, and `license` defaults to
    `apache-2.0` when neither card has one.
    """
    if existing is None:
        data = ModelCardData(**{**fresh.data.to_dict(), "license": fresh.data.license or DEFAULT_LICENSE})
        card = ModelCard(f"---\n{data.to_yaml()}\n---\n{fresh.text}")
    elif not existing.text.strip():
        card = ModelCard(str(existing))
        card.text = fresh.text
    else:
        card = ModelCard(str(existing))
        card.text = _merge_sections(existing.text, fresh.text)
    data, new = card.data, fresh.data
    data.library_name = new.library_name
    data.pipeline_tag = new.pipeline_tag
    if new.base_model:
        data.base_model = new.base_model
    if new.datasets:
        data.datasets = new.datasets
    data.license = new.license or data.license or DEFAULT_LICENSE
    stale = {tag for name, tags in FORMAT_TAGS.items() if name != format for tag in tags}
    data.tags = sorted({*(tag for tag in data.tags or () if tag not in stale), *(new.tags or ())})
    return card


# --------------------------------------------------------------------------------------------------------- helpers
def _merge_sections(existing_text: str, fresh_text: str) -> str:
    fresh = {match["name"]: match.group(0) for match in _SECTION_RE.finditer(fresh_text)}
    present = {match["name"] for match in _SECTION_RE.finditer(existing_text)}

    def replace(match: re.Match) -> str:
        new = fresh.get(match["name"])
        if new is None or (_EMPTY_MARK in new and _EMPTY_MARK not in match.group(0)):
            return match.group(0)
        return new

    text = _SECTION_RE.sub(replace, existing_text)
    missing = [section for name, section in fresh.items() if name not in present]
    if missing:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(missing) + "\n"
    return text


def _describe(model: Any, save_directory: Path, format: str | None) -> tuple[Eagle3Config, int | None, str]:
    """The head's config, its parameter count (`None` when only a config is at hand) and the folder's format."""
    has_config = (save_directory / "config.json").is_file()
    if model is None and not has_config:
        raise FileNotFoundError(
            f"{save_directory / 'config.json'} not found: pass `model=` (the head or its config) to write its card."
        )
    if format is None:
        format = _detect_format(save_directory) if has_config else "eagle3_hf"
    if model is None:
        return _config_from_folder(save_directory, format), None, format
    if isinstance(model, Eagle3Config):
        return model, None, format
    if not isinstance(getattr(model, "config", None), Eagle3Config):
        raise TypeError(f"model must be an Eagle3DraftModel or an Eagle3Config, not {type(model).__name__}.")
    return model.config, sum(parameter.numel() for parameter in model.parameters()), format


def _detect_format(save_directory: Path) -> str:
    from .reading import detect_checkpoint_dialect

    return detect_checkpoint_dialect(save_directory)


def _config_from_folder(save_directory: Path, format: str) -> Eagle3Config:
    if format == "eagle3_hf":
        return Eagle3Config.from_pretrained(save_directory)
    from .files import read_config_dict
    from .reading import config_from_dialect

    return config_from_dialect(read_config_dict(save_directory), format, str(save_directory / "config.json"))


def _training_rows(
    training: Mapping[str, Any] | None, dataset_names: Sequence[str] | None
) -> tuple[list[tuple[str, str]], str | None]:
    """(label, value) rows of the recipe table, known keys first, and the training command if any."""
    if training is None:
        return [], None
    training = dict(training)
    command = training.pop("command", None)
    if dataset_names and "data" not in training:
        training["data"] = list(dataset_names)
    ordered = [key for key in TRAINING_LABELS if key in training] + [k for k in training if k not in TRAINING_LABELS]
    rows = []
    for key in ordered:
        value = _format_duration(training[key]) if key == "wall_time" else _format_value(training[key])
        rows.append((TRAINING_LABELS.get(key, key), _cell(value)))
    return rows, command


def _result_runs(results: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> list[dict]:
    """Validated benchmark runs as `{"machine", "command", "rows": [[cell, ...], ...]}` for the template."""
    if results is None:
        return []
    runs = [results] if isinstance(results, Mapping) else list(results)
    rendered = []
    for index, run in enumerate(runs):
        where = f"results[{index}]" if not isinstance(results, Mapping) else "results"
        for key in ("machine", "command"):
            if not isinstance(run.get(key), str) or not run[key].strip():
                raise ValueError(
                    f"{where}[{key!r}] is missing or empty: the card shows measured numbers only with the machine "
                    "and the command that produced them."
                )
        rows = run.get("rows")
        if not rows:
            raise ValueError(f"{where}['rows'] is missing or empty: expected the rows of `benchmark.summarize`.")
        table = []
        for row_index, row in enumerate(rows):
            if "dataset" not in row or "method" not in row:
                raise ValueError(f"{where}['rows'][{row_index}] needs 'dataset' and 'method'; got keys {sorted(row)}.")
            if "/" in str(row["dataset"]):  # per-category breakdowns (e.g. "mt_bench/coding") stay in results.md
                continue
            table.append([_cell(_result_cell(key, row)) for key in RESULT_COLUMNS])
        rendered.append({"machine": _cell(run["machine"]), "command": run["command"].strip(), "rows": table})
    return rendered


def _result_cell(key: str, row: dict) -> str:
    """The card's cell for column `key` of a benchmark row; the speedup with its 95% interval where the row has one
    (`bench.measure.speedup_interval`): `1.23× (1.15–1.31)`."""
    text = _format_result(key, row.get(key))
    interval = row.get("speedup_interval") if key == "speedup" else None
    return f"{text} ({interval[0]:.2f}–{interval[1]:.2f})" if interval and row.get(key) is not None else text


def _format_result(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "speedup":
        return f"{value:.2f}×"
    if key == "tau":
        return f"{value:.2f}"
    if key == "tokens_per_second":
        return f"{value:.1f}"
    if key == "tree_round_share":  # the share of a head's rounds that drafted a tree (the rest: plain steps)
        return f"{value:.0%}"
    return _format_value(value)


def _format_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format_value(item) for item in value)
    return str(value)


def _format_duration(value: Any) -> str:
    """Seconds as e.g. `3,725 s (1.03 h)`; a string is shown as is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:,.0f} s ({value / 3600:.2f} h)"
    return _format_value(value)


def _format_count(count: int) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"


def _cell(text: str) -> str:
    """Make `text` safe inside a Markdown table cell (one line, no column separator)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _target_link(target: str | None) -> str:
    if target is None:
        return "its target model (not recorded: set `config.target_model_name_or_path`)"
    return f"[`{target}`](https://huggingface.co/{target})" if _is_hub_id(target) else f"`{target}`"


def _is_hub_id(name: str | None) -> bool:
    """True for `org/name` Hub ids that are not an existing local path (a path is invalid `base_model` metadata)."""
    return bool(name) and _HUB_ID_RE.match(name) is not None and not os.path.exists(name)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


__all__ = [
    "create_or_update_model_card",
    "merge_model_cards",
    "render_model_card",
    "write_model_card",
]
