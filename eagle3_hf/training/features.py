"""Target-side inputs of EAGLE-3 training: online from the frozen target, or offline from a sharded cache on disk.

**Online** (`online_target_outputs`): the frozen target runs under `no_grad` in every training step and gives the
features `hidden_states[target_layer_ids]` (concatenated low -> high) and fp32 logits.

**Offline** (`build_feature_cache` / `FeatureCache`): the features and the target's **final (post-norm) hidden
states** are computed once and stored; the logits are recomputed at train time with the target's `lm_head`
(`offline_target_outputs`), which costs one matmul and saves `vocab_size / hidden_size` times the disk (85x for
SmolLM2). Layout of a cache folder:

    plan.json                             what is being built (data hash, layers, dtype, sharding); written first
    shard-00000-of-00012.safetensors      samples [0, samples_per_shard): flat tokens + per-sample offsets
    ...
    manifest.json                         written last: its presence marks the cache complete

Every file is written under a temporary name and renamed, so a shard that exists is whole. An interrupted build
resumes by computing only the missing shards; a cache without `manifest.json` is never read.
"""

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch.utils.data import Dataset as TorchDataset
from transformers import PreTrainedModel

from ..atomic import save_safetensors_atomically, write_json_atomically
from ..target import capture_last_layer_output, gather_target_features


CACHE_FORMAT_VERSION = 1
PLAN_FILE = "plan.json"
MANIFEST_FILE = "manifest.json"
FEATURE_KEYS = ("target_hidden_states", "final_hidden_states")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------------------------------- target outputs
@dataclass
class TargetOutputs:
    """What one training step needs from the target.

    Args:
        features (`torch.Tensor` of shape `(batch, seq, len(target_layer_ids) * target_hidden_size)`).
        logits (`torch.FloatTensor` of shape `(batch, seq, vocab_size)`): fp32 target logits `P`.
        final_hidden_states (`torch.Tensor` of shape `(batch, seq, target_hidden_size)`, *optional*): post-norm
            input of the target's `lm_head` (feature-regression ablation only).
    """

    features: torch.Tensor
    logits: torch.Tensor
    final_hidden_states: torch.Tensor | None = None


@torch.no_grad()
def online_target_outputs(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    layer_ids: list[int],
    with_final_hidden: bool = False,
) -> TargetOutputs:
    """Run the frozen target on `input_ids` `(batch, seq)`, capturing only the needed hidden states."""
    num_layers = target.config.get_text_config().num_hidden_layers
    # hidden_states[L] is the post-norm last hidden state in Transformers, i.e. the input of lm_head.
    request = [*layer_ids, num_layers] if with_final_hidden else list(layer_ids)
    with capture_last_layer_output(target) as captured:  # layer id L: the last layer's pre-norm output
        outputs = target(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=request, use_cache=False
        )
    return TargetOutputs(
        features=gather_target_features(outputs.hidden_states, layer_ids, captured.get("hidden")),
        logits=outputs.logits.float(),
        final_hidden_states=outputs.hidden_states[num_layers] if with_final_hidden else None,
    )


@torch.no_grad()
def target_logits_from_final_hidden(target: PreTrainedModel, final_hidden_states: torch.Tensor) -> torch.Tensor:
    """fp32 target logits `(batch, seq, vocab_size)` from post-norm final hidden states `(batch, seq, hidden)`.

    Applies the target's `lm_head` and, for Gemma-2-style configs, `final_logit_softcapping`. Models that rescale
    logits in other ways (e.g. Cohere's `logit_scale`) are not covered; train those online.
    """
    lm_head = target.get_output_embeddings()
    logits = lm_head(final_hidden_states.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)).float()
    softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def offline_target_outputs(
    target: PreTrainedModel, features: torch.Tensor, final_hidden_states: torch.Tensor
) -> TargetOutputs:
    """`TargetOutputs` from cached features and final hidden states (logits recomputed with the target's head)."""
    return TargetOutputs(
        features=features,
        logits=target_logits_from_final_hidden(target, final_hidden_states),
        final_hidden_states=final_hidden_states,
    )


# ------------------------------------------------------------------------------------------------------- plan
@dataclass
class FeatureCachePlan:
    """What a feature cache holds; `plan.json` stores it and a resumed build must match it exactly."""

    num_samples: int
    num_tokens: int
    samples_per_shard: int
    layer_ids: list[int]
    target_hidden_size: int
    dtype: str
    tokens_sha256: str
    target_name_or_path: str
    format_version: int = CACHE_FORMAT_VERSION

    @property
    def num_shards(self) -> int:
        return -(-self.num_samples // self.samples_per_shard)

    @property
    def bytes_per_token(self) -> int:
        """Features + final hidden state in `dtype`, plus the int32 token id kept to check the data on read."""
        width = (len(self.layer_ids) + 1) * self.target_hidden_size
        return width * _DTYPES[self.dtype].itemsize + 4

    @property
    def estimated_bytes(self) -> int:
        return self.num_tokens * self.bytes_per_token + 8 * (self.num_samples + self.num_shards)

    def shard_name(self, index: int) -> str:
        return f"shard-{index:05d}-of-{self.num_shards:05d}.safetensors"

    def shard_range(self, index: int) -> tuple[int, int]:
        start = index * self.samples_per_shard
        return start, min(start + self.samples_per_shard, self.num_samples)

    def describe(self, cache_dir: str | os.PathLike) -> str:
        per_million = self.bytes_per_token * 1e6 / 2**30
        return (
            f"Feature cache {cache_dir}: {self.num_samples} samples, {self.num_tokens} tokens, {self.num_shards} "
            f"shard(s), layers {self.layer_ids} + final hidden in {self.dtype}: {self.bytes_per_token} bytes/token, "
            f"about {self.estimated_bytes / 2**30:.3f} GiB in all ({per_million:.2f} GiB per million tokens)."
        )


def _input_ids_column(dataset) -> list[list[int]]:
    if "input_ids" not in dataset.column_names:
        raise ValueError(f"The dataset has columns {dataset.column_names}; the feature cache needs 'input_ids'.")
    return dataset["input_ids"]


def plan_feature_cache(
    dataset,
    target: PreTrainedModel,
    layer_ids: list[int],
    dtype: str = "bfloat16",
    samples_per_shard: int | None = None,
    shard_bytes: int = 2**30,
) -> FeatureCachePlan:
    """Plan (and size) a cache of `target`'s features for `dataset` (a `datasets.Dataset` with `input_ids`).

    `samples_per_shard` defaults to what fills about `shard_bytes` (1 GiB) at the data's mean length: a shard is
    held in memory while it is built, and is the unit of resumption.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}; expected one of {list(_DTYPES)}.")
    if samples_per_shard is not None and samples_per_shard < 1:
        raise ValueError(f"samples_per_shard={samples_per_shard} must be >= 1.")
    digest, num_tokens = hashlib.sha256(), 0
    for ids in _input_ids_column(dataset):
        digest.update(torch.tensor(ids, dtype=torch.int32).numpy().tobytes() + b"|")
        num_tokens += len(ids)
    plan = FeatureCachePlan(
        num_samples=len(dataset),
        num_tokens=num_tokens,
        samples_per_shard=samples_per_shard or 1,
        layer_ids=list(layer_ids),
        target_hidden_size=target.config.get_text_config().hidden_size,
        dtype=dtype,
        tokens_sha256=digest.hexdigest(),
        target_name_or_path=target.name_or_path or type(target).__name__,
    )
    if samples_per_shard is None:
        bytes_per_sample = plan.bytes_per_token * num_tokens / max(len(dataset), 1)
        plan.samples_per_shard = max(1, int(shard_bytes // max(bytes_per_sample, 1)))
    return plan


def _check_or_write_plan(cache_dir: Path, plan: FeatureCachePlan) -> None:
    plan_path = cache_dir / PLAN_FILE
    if plan_path.exists():
        existing = json.loads(plan_path.read_text())
        expected = asdict(plan)
        different = sorted(key for key in expected if existing.get(key) != expected[key])
        if different:
            raise ValueError(
                f"{plan_path} was written for different inputs (fields {different} differ), so the shards in "
                f"{cache_dir} cannot be reused. Delete the folder or pick another feature_cache_dir."
            )
        return
    write_json_atomically(plan_path, asdict(plan))


# ------------------------------------------------------------------------------------------------------ build
@torch.no_grad()
def _shard_tensors(
    target: PreTrainedModel, rows: list[list[int]], plan: FeatureCachePlan, batch_size: int
) -> dict[str, torch.Tensor]:
    """Features of the samples `rows`, stored flat: `(num_tokens, width)` plus `offsets` `(num_samples + 1,)`."""
    decoder, device = target.get_decoder(), target.get_input_embeddings().weight.device
    dtype = _DTYPES[plan.dtype]
    features, finals = [], []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        lengths = [len(ids) for ids in batch]
        input_ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention_mask[i, : len(ids)] = 1
        # The decoder alone: the logits are not stored, so lm_head is skipped here.
        with capture_last_layer_output(target) as captured:  # layer id L: the last layer's pre-norm output
            outputs = decoder(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                output_hidden_states=list(plan.layer_ids),
                use_cache=False,
            )
        gathered = gather_target_features(outputs.hidden_states, plan.layer_ids, captured.get("hidden"))
        gathered = gathered.to("cpu", dtype)
        final = outputs.last_hidden_state.to("cpu", dtype)
        for i, length in enumerate(lengths):
            features.append(gathered[i, :length])
            finals.append(final[i, :length])
    lengths = torch.tensor([0] + [len(ids) for ids in rows])
    return {
        "input_ids": torch.tensor([token for ids in rows for token in ids], dtype=torch.int32),
        "offsets": torch.cumsum(lengths, 0),
        "target_hidden_states": torch.cat(features).contiguous(),
        "final_hidden_states": torch.cat(finals).contiguous(),
    }


def _write_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_safetensors_atomically(tensors, path, metadata={"format_version": str(CACHE_FORMAT_VERSION)})


def _is_whole_shard(path: Path) -> bool:
    """A shard that exists was renamed whole; reading its header also catches one damaged since (rebuilt then)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return set(handle.keys()) == {"input_ids", "offsets", *FEATURE_KEYS}
    except (OSError, SafetensorError):
        return False


def _write_manifest_if_complete(cache_dir: Path, plan: FeatureCachePlan) -> bool:
    shards = []
    for index in range(plan.num_shards):
        path = cache_dir / plan.shard_name(index)
        if not path.exists():
            return False
        start, end = plan.shard_range(index)
        shards.append(
            {"file": path.name, "first_sample": start, "num_samples": end - start, "bytes": path.stat().st_size}
        )
    write_json_atomically(cache_dir / MANIFEST_FILE, {**asdict(plan), "shards": shards})
    return True


def build_feature_cache(
    target: PreTrainedModel,
    dataset,
    cache_dir: str | os.PathLike,
    layer_ids: list[int],
    dtype: str = "bfloat16",
    samples_per_shard: int | None = None,
    batch_size: int = 4,
    process_index: int = 0,
    num_processes: int = 1,
    verbose: bool = True,
) -> "FeatureCache | None":
    """Compute and store `target`'s features for every sample of `dataset`, resuming an interrupted build.

    Prints the size estimate before any work, refuses to start when the disk lacks the space, then writes the
    missing shards. With several processes, process `p` builds shards `p, p + n, ...`; whichever finds all shards
    present writes `manifest.json`.

    Args:
        target (`PreTrainedModel`): the frozen target (any device, any dtype).
        dataset (`datasets.Dataset`): with an `input_ids` column (lists of target token ids).
        cache_dir (`str` or `os.PathLike`): the cache folder, created if needed.
        layer_ids (`list[int]`): EAGLE layer ids, as in `Eagle3Config.target_layer_ids`.
        dtype (`str`, defaults to `"bfloat16"`): storage dtype.
        samples_per_shard (`int`, *optional*): samples per shard (the unit of resumption); by default about 1 GiB
            of features per shard.
        batch_size (`int`, defaults to 4): target batch size while building.

    Returns:
        The opened `FeatureCache` when the cache is complete, else `None` (other processes still building).
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_feature_cache(dataset, target, layer_ids, dtype, samples_per_shard)
    _check_or_write_plan(cache_dir, plan)
    if (cache_dir / MANIFEST_FILE).exists():
        return FeatureCache(cache_dir)
    whole = {index for index in range(plan.num_shards) if _is_whole_shard(cache_dir / plan.shard_name(index))}
    mine = range(process_index, plan.num_shards, num_processes)
    missing = [index for index in mine if index not in whole]
    if verbose:
        print(plan.describe(cache_dir))
        share = "" if num_processes == 1 else f" ({len(mine)} of them this process's, 1 in {num_processes})"
        print(f"{len(whole)} of {plan.num_shards} shard(s) already present; building {len(missing)}{share}.")
    needed = plan.estimated_bytes * len(missing) / max(plan.num_shards, 1)
    free = shutil.disk_usage(cache_dir).free
    if needed > free:
        raise OSError(
            f"The feature cache needs about {needed / 2**30:.2f} GiB more but {cache_dir} has "
            f"{free / 2**30:.2f} GiB free."
        )
    for index in missing:  # leftovers of a killed build; only this process's shards, others may be writing theirs
        for stale in cache_dir.glob(f".{plan.shard_name(index)}.*.tmp"):
            stale.unlink()
    rows = _input_ids_column(dataset)
    was_training = target.training
    target.eval()
    try:
        for count, index in enumerate(missing, 1):
            start, end = plan.shard_range(index)
            _write_shard(_shard_tensors(target, rows[start:end], plan, batch_size), cache_dir / plan.shard_name(index))
            if verbose:
                print(f"  wrote {plan.shard_name(index)} ({count}/{len(missing)})", flush=True)
    finally:
        target.train(was_training)
    if _write_manifest_if_complete(cache_dir, plan):
        return FeatureCache(cache_dir)
    return None


# ------------------------------------------------------------------------------------------------------- read
class FeatureCacheIncompleteError(RuntimeError):
    """The folder has no `manifest.json`: the build has not finished (or was interrupted)."""


class FeatureCache:
    """Read-only view of a complete feature cache; `cache[i]` is sample `i`.

    Raises `FeatureCacheIncompleteError` when `manifest.json` is missing and `ValueError` when a shard listed in it
    is missing or has another size than recorded.
    """

    def __init__(self, cache_dir: str | os.PathLike):
        self.cache_dir = Path(cache_dir)
        manifest_path = self.cache_dir / MANIFEST_FILE
        if not manifest_path.exists():
            present = len(list(self.cache_dir.glob("shard-*.safetensors")))
            raise FeatureCacheIncompleteError(
                f"{self.cache_dir} is not a complete feature cache (no {MANIFEST_FILE}; {present} shard(s) present). "
                "Run build_feature_cache again (or `eagle3-hf train --feature_mode offline`) to resume it."
            )
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format_version") != CACHE_FORMAT_VERSION:
            raise ValueError(
                f"{manifest_path}: format_version {self.manifest.get('format_version')} is not "
                f"{CACHE_FORMAT_VERSION}; rebuild the cache."
            )
        for shard in self.manifest["shards"]:
            path = self.cache_dir / shard["file"]
            if not path.exists() or path.stat().st_size != shard["bytes"]:
                raise ValueError(f"{path} is missing or has changed since {MANIFEST_FILE} was written.")
        self.plan = FeatureCachePlan(**{k: v for k, v in self.manifest.items() if k != "shards"})
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.plan.num_samples

    def check_matches(self, config, target: PreTrainedModel) -> None:
        """Raise `ValueError` unless the cache holds the features that a head of `config` reads from `target`.

        Compares the cache's `layer_ids` with `config.target_layer_ids`, its feature width `len(layer_ids) *
        target_hidden_size` with `config.num_target_features` and, when both are known, its `target_name_or_path`
        with `target.name_or_path`. A nameless target is not compared, nor one whose cache recorded only its class
        name (what `plan_feature_cache` records for a nameless target).
        """
        plan, problems = self.plan, []
        if list(plan.layer_ids) != list(config.target_layer_ids):
            problems.append(
                f"layer_ids={plan.layer_ids} but the head reads target_layer_ids={config.target_layer_ids}"
            )
        width = len(plan.layer_ids) * plan.target_hidden_size
        if width != config.num_target_features:
            problems.append(
                f"features {width} wide (len(layer_ids) * target_hidden_size={plan.target_hidden_size}) but the "
                f"head's fc reads num_target_features={config.num_target_features}"
            )
        if target.name_or_path and plan.target_name_or_path not in (target.name_or_path, type(target).__name__):
            problems.append(
                f"target_name_or_path={plan.target_name_or_path!r} but the target is {target.name_or_path!r} (if "
                "these are the same weights under two names, set the target's name_or_path to the cache's)"
            )
        if problems:
            raise ValueError(
                f"The feature cache {self.cache_dir} was built for another head or target: {'; '.join(problems)}. "
                "Build a cache for this head and target (build_feature_cache(target, dataset, cache_dir, "
                "draft.config.target_layer_ids)) in another folder."
            )

    def _shard(self, index: int):
        if index not in self._handles:
            handle = safe_open(str(self.cache_dir / self.plan.shard_name(index)), framework="pt")
            self._handles[index] = handle
            self._offsets[index] = handle.get_tensor("offsets")
        return self._handles[index], self._offsets[index]

    def __getitem__(self, sample: int) -> dict[str, torch.Tensor]:
        """`input_ids` `(seq,)`, `target_hidden_states` `(seq, len(layer_ids) * H)`, `final_hidden_states`
        `(seq, H)`."""
        if not 0 <= sample < len(self):
            raise IndexError(f"sample {sample} is out of range for a feature cache of {len(self)} samples.")
        handle, offsets = self._shard(sample // self.plan.samples_per_shard)
        local = sample % self.plan.samples_per_shard
        start, end = int(offsets[local]), int(offsets[local + 1])
        item = {key: handle.get_slice(key)[start:end] for key in ("input_ids", *FEATURE_KEYS)}
        item["input_ids"] = item["input_ids"].long()
        return item

    def __getstate__(self):
        # safetensors handles do not pickle (DataLoader workers); each worker reopens its own.
        return {**self.__dict__, "_handles": {}, "_offsets": {}}


class CachedFeatureDataset(TorchDataset):
    """`dataset[i]` plus the cached `target_hidden_states` and `final_hidden_states` of sample `i`.

    Checks, per sample, that the cached token ids are the dataset's: a cache built for other data fails loudly.
    """

    def __init__(self, dataset, cache: FeatureCache):
        if len(dataset) != len(cache):
            raise ValueError(
                f"The dataset has {len(dataset)} samples but the feature cache {cache.cache_dir} has "
                f"{len(cache)}; it was built for other data."
            )
        self.dataset, self.cache = dataset, cache

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        example, cached = dict(self.dataset[index]), self.cache[index]
        if cached["input_ids"].tolist() != list(example["input_ids"]):
            raise ValueError(
                f"Sample {index}: the token ids in the feature cache {self.cache.cache_dir} differ "
                "from the dataset's; rebuild the cache for this data."
            )
        return {**example, **{key: cached[key] for key in FEATURE_KEYS}}


__all__ = [
    "CachedFeatureDataset",
    "FeatureCache",
    "FeatureCacheIncompleteError",
    "FeatureCachePlan",
    "TargetOutputs",
    "build_feature_cache",
    "offline_target_outputs",
    "online_target_outputs",
    "plan_feature_cache",
    "target_logits_from_final_hidden",
]
