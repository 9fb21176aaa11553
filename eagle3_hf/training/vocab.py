"""Choosing a draft vocabulary from training data, and its cache file.

`build_draft_vocab` keeps the most frequent target ids at loss-masked positions; the maps it returns follow the
head's convention (`eagle3_hf.modeling_eagle3`: `d2t` offsets, `t2d` membership, draft ids in ascending target-id
order). `load_or_build_draft_vocab` caches them in a safetensors file keyed by the data, tokenizer and sizes.
"""

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..atomic import save_safetensors_atomically
from ..vocab_maps import check_vocab_maps, maps_from_token_ids


logger = logging.getLogger(__name__)
# Header entry of a draft-vocabulary safetensors file that holds its JSON metadata.
_METADATA_KEY = "eagle3_draft_vocab"


class _UnreadableVocabFile(ValueError):
    """A draft-vocabulary file that cannot be read back (cut short, not safetensors, maps that disagree)."""


# ------------------------------------------------------------------------------ building a draft vocabulary


@dataclass
class DraftVocab:
    """A draft vocabulary chosen from training data.

    Attributes:
        d2t (`torch.LongTensor` of shape `(draft_vocab_size,)`): offsets, draft id `i` is target id `i + d2t[i]`.
        t2d (`torch.BoolTensor` of shape `(vocab_size,)`): target ids in the draft vocabulary.
        counts (`torch.LongTensor` of shape `(vocab_size,)`): occurrences of each target id at loss-masked positions.
        metadata (`dict`): the cache key (`dataset_fingerprint`, `tokenizer`, `vocab_size`, `draft_vocab_size`) plus
            `coverage`, `filled` (ids added only to reach `draft_vocab_size`) and, when the builder had the
            tokenizer, `tokenizer_fingerprint` (`eagle3_hf.training.data.tokenizer_fingerprint`).
        path (`str`, *optional*): the file it was read from (`load_draft_vocab`), for error messages.
    """

    d2t: torch.Tensor
    t2d: torch.Tensor
    counts: torch.Tensor
    metadata: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def token_ids(self) -> torch.Tensor:
        """The target ids of the draft vocabulary, ascending (int64 `[V_d]`)."""
        return torch.arange(self.d2t.shape[0]) + self.d2t

    @property
    def coverage(self) -> float:
        """Fraction of the loss-masked training tokens whose target id is in the draft vocabulary."""
        total = int(self.counts.sum())
        return int(self.counts[self.t2d].sum()) / total if total else 0.0


def count_loss_tokens(dataset, vocab_size: int, batch_size: int = 1024) -> torch.Tensor:
    """Count target ids at `loss_mask == 1` positions of a dataset with `input_ids` / `loss_mask` columns.

    Returns an int64 tensor `[vocab_size]`. Raises `ValueError` for ids outside `[0, vocab_size)`.
    """
    import numpy as np
    import pyarrow.compute as pc

    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in dataset.select_columns(["input_ids", "loss_mask"]).with_format("arrow").iter(batch_size=batch_size):
        ids = pc.list_flatten(batch["input_ids"]).to_numpy(zero_copy_only=False)
        mask = pc.list_flatten(batch["loss_mask"]).to_numpy(zero_copy_only=False).astype(bool)
        if ids.shape != mask.shape:
            raise ValueError("input_ids and loss_mask rows differ in length.")
        ids = ids[mask]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"input_ids holds id {int(ids.max())} outside the target vocabulary [0, {vocab_size}).")
        counts += np.bincount(ids, minlength=vocab_size)
    return torch.from_numpy(counts)


def select_draft_token_ids(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, int]:
    """The `draft_vocab_size` most frequent target ids, sorted ascending, and how many were filled in.

    Ties in frequency go to the lower id. If fewer than `draft_vocab_size` ids occur, the lowest ids that never
    occur fill the rest (deterministic; they cover nothing). `counts`: int64 `[V]`. Returns `(ids [V_d], filled)`.
    """
    vocab_size = counts.shape[0]
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in [1, vocab_size={vocab_size}].")
    # Stable sort of -count keeps ascending ids within a tie.
    order = torch.sort(-counts, stable=True).indices
    chosen = order[: min(draft_vocab_size, int((counts > 0).sum()))]
    filled = draft_vocab_size - chosen.numel()
    if filled:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[chosen] = False
        chosen = torch.cat([chosen, unused.nonzero().flatten()[:filled]])
    return torch.sort(chosen).values, filled


def build_draft_vocab(dataset, vocab_size: int, draft_vocab_size: int, **metadata) -> DraftVocab:
    """Choose a draft vocabulary from a training dataset (see `select_draft_token_ids`) and log its coverage.

    `metadata` (e.g. `tokenizer=...`) is stored with the result; `dataset_fingerprint` is added.
    """
    counts = count_loss_tokens(dataset, vocab_size)
    if not int(counts.sum()):
        raise ValueError("The dataset has no loss-masked token to count.")
    token_ids, filled = select_draft_token_ids(counts, draft_vocab_size)
    d2t, t2d = maps_from_token_ids(token_ids, vocab_size)
    vocab = DraftVocab(d2t, t2d, counts)
    vocab.metadata = {
        **vocab_cache_key(dataset, vocab_size, draft_vocab_size, metadata.pop("tokenizer", None)),
        **metadata,
        "coverage": vocab.coverage,
        "filled": filled,
        "loss_tokens": int(counts.sum()),
        "distinct_tokens": int((counts > 0).sum()),
    }
    logger.info(
        f"Draft vocabulary: {draft_vocab_size} of {vocab_size} target ids cover {vocab.coverage:.2%} of "
        f"{int(counts.sum())} loss-masked tokens ({filled} filled in)."
    )
    return vocab


def vocab_cache_key(dataset, vocab_size: int, draft_vocab_size: int, tokenizer: str | None) -> dict[str, Any]:
    """The metadata that identifies a draft vocabulary built from `dataset`: a stored vocabulary is reused only when
    its metadata holds these same values (`load_or_build_draft_vocab`, `eagle3-hf train --draft_vocab_file`)."""
    # datasets exposes the fingerprint only as this attribute; build_training_dataset sets it from the data,
    # the tokenizer and the settings.
    return {
        "dataset_fingerprint": dataset._fingerprint,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
    }


def save_draft_vocab(vocab: DraftVocab, path: str | os.PathLike) -> None:
    """Write `d2t`, `t2d`, `counts` to a safetensors file, with `metadata` as JSON in its header.

    The file is written next to `path` under a hidden name and renamed over it, so an interrupted write leaves
    the previous file (or none), never a truncated one.
    """
    tensors = {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous(), "counts": vocab.counts.contiguous()}
    save_safetensors_atomically(tensors, path, metadata={_METADATA_KEY: json.dumps(vocab.metadata)})


def load_draft_vocab(path: str | os.PathLike) -> DraftVocab:
    """Read a file written by `save_draft_vocab`; checks that `d2t` and `t2d` agree.

    Raises `ValueError` naming the file when it is not a draft vocabulary file, cannot be read (e.g. cut short)
    or holds maps that disagree.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as file:
            header = file.metadata() or {}
            names = set(file.keys())
            if _METADATA_KEY in header and names == {"d2t", "t2d", "counts"}:
                tensors = [file.get_tensor(name) for name in ("d2t", "t2d", "counts")]
    except SafetensorError as error:
        raise _UnreadableVocabFile(f"{path}: unreadable safetensors file ({error}); is it truncated?") from error
    if _METADATA_KEY not in header or names != {"d2t", "t2d", "counts"}:
        raise ValueError(f"{path} is not a draft vocabulary file (expected d2t, t2d, counts and {_METADATA_KEY}).")
    try:
        vocab = DraftVocab(*tensors, metadata=json.loads(header[_METADATA_KEY]), path=str(path))
        check_vocab_maps(vocab.d2t, vocab.t2d, vocab.d2t.shape[0], vocab.t2d.shape[0])
    except ValueError as error:  # json.JSONDecodeError included
        raise _UnreadableVocabFile(f"{path}: {error}") from error
    return vocab


def check_draft_vocab(vocab: DraftVocab, vocab_size: int, tokenizer=None) -> None:
    """Raise `ValueError` naming the file and field when `vocab` was built for another target vocabulary.

    Checked: the size of its target vocabulary (`t2d` and `metadata["vocab_size"]`) against `vocab_size`, and, where
    both are known, its `metadata["tokenizer_fingerprint"]` against `tokenizer`'s: a file built with another
    tokenizer of the same size maps the wrong tokens, which nothing else would notice.
    """
    from .data import tokenizer_fingerprint

    where = vocab.path or "the draft vocabulary"
    recorded = vocab.metadata.get("vocab_size", vocab.t2d.shape[0])
    if vocab.t2d.shape[0] != vocab_size or recorded != vocab_size:
        raise ValueError(
            f"{where}: vocab_size={recorded} (t2d has {vocab.t2d.shape[0]} entries) but the target's vocabulary has "
            f"{vocab_size} ids; it was built for another tokenizer ({vocab.metadata.get('tokenizer')!r}). Build one "
            "for this target with `eagle3-hf vocab`."
        )
    stored = vocab.metadata.get("tokenizer_fingerprint")
    if stored is not None and tokenizer is not None and stored != (current := tokenizer_fingerprint(tokenizer)):
        raise ValueError(
            f"{where}: tokenizer_fingerprint={stored!r} (tokenizer {vocab.metadata.get('tokenizer')!r}) but this "
            f"target's tokenizer has {current!r}: the file maps another tokenizer's ids. Build one for this target "
            "with `eagle3-hf vocab`."
        )


def load_or_build_draft_vocab(
    dataset,
    vocab_size: int,
    draft_vocab_size: int,
    cache_path: str | os.PathLike,
    tokenizer: str | None = None,
    tokenizer_fingerprint: str | None = None,
) -> DraftVocab:
    """Load the vocabulary cached at `cache_path` if it was built from this very dataset (fingerprint), tokenizer
        name and sizes; otherwise build it and (over)write the cache (`tokenizer_fingerprint` is stored with it, for
    `check_draft_vocab`). A stale cache is never reused; an unreadable
        one (e.g. cut short) is rebuilt with a warning; a file that is no draft vocabulary raises `ValueError`."""
    key = vocab_cache_key(dataset, vocab_size, draft_vocab_size, tokenizer)
    if Path(cache_path).is_file():
        try:
            cached = load_draft_vocab(cache_path)
        except _UnreadableVocabFile as error:
            logger.warning(f"{error}; rebuilding the draft vocabulary cache {cache_path}.")
        else:
            if all(cached.metadata.get(name) == value for name, value in key.items()):
                logger.info(f"Reusing the draft vocabulary cached in {cache_path}.")
                return cached
            logger.warning(f"{cache_path} was built for other data or sizes; rebuilding it.")
    extra = {"tokenizer_fingerprint": tokenizer_fingerprint} if tokenizer_fingerprint else {}
    vocab = build_draft_vocab(dataset, vocab_size, draft_vocab_size, tokenizer=tokenizer, **extra)
    save_draft_vocab(vocab, cache_path)
    return vocab
