"""Chat data for EAGLE-3 training: conversations -> `input_ids` / `loss_mask`, and `DataCollatorForEagle3`.

Each conversation (read and normalised by `eagle3_hf.training.records`) is rendered with the target's own chat
template; `loss_mask` marks the tokens of assistant turns (content and end-of-turn marker), found generically by
rendering prefixes of the conversation (no hard-coded separators). See docs/training-data.md.
"""

import hashlib
import itertools
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jinja2 import TemplateError
from transformers.data.data_collator import DataCollatorMixin

from .records import iter_records, training_messages


if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

# Stands in for an assistant message's content to find where a template puts it; long and odd so real text
# never contains it.
_SENTINEL = "<<eagle3-assistant-content-5f1c9e>>"
# Bump when the rendering or masking rules change, so fingerprints (and vocab caches keyed on them) change too.
# 2: approximate spans are searched for only inside their own turn.
_FORMAT_VERSION = 2


@dataclass
class DataStats:
    """Counts from `build_training_dataset` (also stored as JSON in `dataset.info.description`).

    `read`: records read from the source (after `offset`/`limit`). `empty`: conversations with no user turn followed by
    an assistant turn once cleaned. `invalid`: malformed records (unknown role, non-string content) or chat template
    errors. `excluded`: records left out as asked (`exclude`: those that overlap the benchmark's evaluation prompts,
    see `eagle3_hf.training.exclusion.screen_training_records`). `dropped`: overlong samples with `overflow="drop"`, or
    truncated ones left with no assistant token. `truncated`: kept samples cut to `max_length`. `kept`: rows of the
    dataset. `approximate`: kept rows whose template renders earlier turns differently from a conversation's end, so an
    assistant span was found by search (see docs). `loss_tokens`/`tokens`: masked and total tokens kept. `fingerprint`:
    the dataset's fingerprint.
    """

    read: int = 0
    kept: int = 0
    truncated: int = 0
    dropped: int = 0
    empty: int = 0
    invalid: int = 0
    excluded: int = 0
    approximate: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    fingerprint: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dataset(cls, dataset: "Dataset") -> "DataStats":
        """Read the stats that `build_training_dataset` stored in `dataset.info.description`."""
        try:
            values = json.loads(dataset.info.description or "")
        except json.JSONDecodeError as error:
            raise ValueError(
                "dataset.info.description holds no DataStats JSON; was the dataset made by build_training_dataset?"
            ) from error
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


# -------------------------------------------------------------------------------------- rendering and the mask


def _render(tokenizer, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


def _with_sentinel(messages: list[dict[str, str]], index: int) -> list[dict[str, str]]:
    """`messages` with message `index`'s content replaced by `_SENTINEL`."""
    return [*messages[:index], {**messages[index], "content": _SENTINEL}, *messages[index + 1 :]]


def _assistant_turn_text(tokenizer, messages: list[dict[str, str]], index: int) -> tuple[str, str, str | None]:
    """How the template renders assistant message `index` when it ends the conversation.

    Returns `(turn, content, head)`: `turn` is the rendered content plus the end-of-turn marker, with the
    whitespace after the marker removed (the model stops at the marker and never produces it); `content` is the
    rendered content alone; `head` is the render of everything before the content (the earlier turns and this
    turn's header), or None when the template does not keep the content between a fixed head and tail.
    """
    probe = _render(tokenizer, _with_sentinel(messages[: index + 1], index))
    head, found, tail = probe.partition(_SENTINEL)
    rendered = _render(tokenizer, messages[: index + 1])
    if not found or not rendered.startswith(head) or not rendered.endswith(tail) or len(rendered) < len(head + tail):
        content = messages[index]["content"].strip()
        return content, content, None
    content = rendered[len(head) : len(rendered) - len(tail)]
    return content + tail.rstrip(), content, head


def _assistant_turn_region(tokenizer, messages: list[dict[str, str]], index: int, text: str) -> tuple[int, int]:
    """Where the template puts assistant message `index`'s content in `text`, the render of all of `messages`.

    Renders all of `messages` with a sentinel as this message's content: the text before the sentinel ends with
    this turn's header, the text after it holds the later turns. Returns `(start, stop)`: `start` is right after
    the header, `stop` is where the later turns begin (`len(text)` if `text` does not end with them). Raises
    `ValueError` if `text` does not start with the text before the sentinel.
    """
    before, found, after = _render(tokenizer, _with_sentinel(messages, index)).partition(_SENTINEL)
    if not found or not text.startswith(before):
        raise ValueError(f"assistant turn {index}: its header is not in the rendered conversation.")
    stop = len(text) - len(after)
    return len(before), stop if text.endswith(after) and stop >= len(before) else len(text)


def render_conversation(tokenizer, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]], bool]:
    """Render `messages` with the tokenizer's chat template; find the character span of each assistant turn.

    Returns `(text, spans, approximate)`. A span covers the turn's content and end-of-turn marker (e.g.
    `Hi<|im_end|>` in ChatML, `Hi<|eot_id|>` in Llama 3), as the template renders them: the template is rendered
    with a sentinel as the turn's content to find its head and tail, then with the real content. For templates
    whose render of a conversation starts with the render of each of its prefixes (ChatML, Llama 3, Gemma, ...)
    the spans are exact. Otherwise (e.g. a template that renders earlier turns differently) the turn is searched
    for inside its own region of the render (after its header, before the later turns; see
    `_assistant_turn_region`), then its content alone, and `approximate` is True. Raises `ValueError` if a turn
    cannot be found there.
    """
    text = _render(tokenizer, messages)
    spans: list[tuple[int, int]] = []
    cursor, approximate = 0, False
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn, content, head = _assistant_turn_text(tokenizer, messages, index)
        if head is not None and len(head) >= cursor and text.startswith(head) and text.startswith(turn, len(head)):
            start = len(head)
        else:
            # Search only this turn's own region: the content may also occur in a user turn (a prompt that quotes
            # the answer) or in a later answer, and a match there would put the loss on the wrong text.
            approximate = True
            low, stop = _assistant_turn_region(tokenizer, messages, index, text)
            low = max(low, cursor)
            start = text.find(turn, low, stop + len(turn) - len(content))  # the marker may follow the region
            if start < 0:
                turn, start = content, text.find(content, low, stop)
            if start < 0 or not turn:
                raise ValueError(
                    f"assistant turn {index} ({content[:40]!r}...) is not in its own turn of the rendered conversation."
                )
        spans.append((start, start + len(turn)))
        cursor = start + len(turn)
    return text, spans, approximate


def render_plain_text(
    tokenizer, messages: list[dict[str, str]], loss: str = "all"
) -> tuple[str, list[tuple[int, int]]]:
    """Render for a tokenizer without a chat template: BOS (if any), then the contents joined by blank lines.

    `loss="all"` puts every token after BOS in the loss (a base model continues any text); `"assistant"` only the
    assistant contents. Returns `(text, spans)`.
    """
    if loss not in ("all", "assistant"):
        raise ValueError(f"plain_text_loss={loss!r}; expected 'all' or 'assistant'.")
    bos = tokenizer.bos_token or ""
    text, spans = bos, []
    for index, message in enumerate(messages):
        text += "\n\n" if index else ""
        if message["role"] == "assistant":
            spans.append((len(text), len(text) + len(message["content"])))
        text += message["content"]
    return text, spans if loss == "assistant" else [(len(bos), len(text))]


def _token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]], text_length: int) -> list[int]:
    """1 for tokens whose characters overlap any span (offsets: `[T]` (start, end) pairs)."""
    inside = np.zeros(text_length + 1, dtype=np.int64)
    for start, end in spans:
        inside[start] += 1
        inside[end] -= 1
    # prefix[c] = number of characters before c that lie inside a span
    prefix = np.concatenate([[0], np.cumsum(np.cumsum(inside)[:-1] > 0)])
    offsets_array = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    return (prefix[offsets_array[:, 1]] > prefix[offsets_array[:, 0]]).astype(np.int64).tolist()


def tokenize_with_mask(tokenizer, texts: list[str], spans: list[list[tuple[int, int]]]) -> list[tuple[list, list]]:
    """Tokenise rendered texts (no special tokens added: the template has them) -> `(input_ids, loss_mask)` each."""
    if tokenizer.is_fast:
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            (ids, _token_mask(offsets, row_spans, len(text)))
            for ids, offsets, row_spans, text in zip(encoded["input_ids"], encoded["offset_mapping"], spans, texts)
        ]
    # Python tokenizers have no offsets: tokenise the pieces between span boundaries separately.
    results = []
    for text, row_spans in zip(texts, spans):
        bounds = sorted({0, len(text), *itertools.chain.from_iterable(row_spans)})
        ids, mask = [], []
        for start, end in itertools.pairwise(bounds):
            piece = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
            inside = any(a <= start and end <= b for a, b in row_spans)
            ids += piece
            mask += [int(inside)] * len(piece)
        results.append((ids, mask))
    return results


# ------------------------------------------------------------------------------------------- building a dataset


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of what decides rendering and tokenisation: the tokenizer's full serialisation (or vocabulary)
    and its chat template. The name or local path is left out, so the same tokenizer hashes the same everywhere."""
    digest = hashlib.sha256()
    if tokenizer.is_fast:
        digest.update(tokenizer.backend_tokenizer.to_str().encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(json.dumps([type(tokenizer).__name__, tokenizer.chat_template, tokenizer.bos_token]).encode())
    return digest.hexdigest()[:16]


def _render_for_training(
    tokenizer, messages, plain_text_loss: str, index: int
) -> tuple[str, list[tuple[int, int]], bool, str]:
    """`(text, spans, approximate, status)` for record `index`; status "invalid" if the template rejects it."""
    try:
        if tokenizer.chat_template is None:
            return *render_plain_text(tokenizer, messages, plain_text_loss), False, "kept"
        return *render_conversation(tokenizer, messages), "kept"
    except (TemplateError, ValueError) as error:
        logger.debug(f"Skipping record {index}, which the chat template cannot render or mask: {error}")
        return "", [], False, "invalid"


def _tokenize_batch(batch, tokenizer, max_length: int, overflow: str, plain_text_loss: str) -> dict[str, list]:
    """`datasets.map` function: `messages` (and the source `index`) -> `input_ids`, `loss_mask` and bookkeeping
    columns."""
    texts, spans, approximate, statuses = zip(
        *(
            _render_for_training(tokenizer, messages, plain_text_loss, index)
            for messages, index in zip(batch["messages"], batch["index"])
        )
    )
    out = {"input_ids": [], "loss_mask": [], "status": [], "approximate": list(approximate)}
    for (ids, mask), status in zip(tokenize_with_mask(tokenizer, list(texts), list(spans)), statuses):
        if status == "kept" and len(ids) > max_length:
            if overflow == "drop":
                status = "dropped"
            else:
                ids, mask, status = ids[:max_length], mask[:max_length], "truncated"
        if status in ("kept", "truncated") and not any(mask):
            status = "dropped"  # truncation left no assistant token
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["status"].append(status)
    out["num_tokens"] = [len(ids) for ids in out["input_ids"]]
    out["num_loss_tokens"] = [sum(mask) for mask in out["loss_mask"]]
    return out


def _read_conversations(
    source, offset: int, limit: int | None, system_prompt: str | None, stats: DataStats, digest, exclude: set[int]
) -> tuple[list[list[dict[str, str]]], list[int]]:
    """The cleaned conversations of `source[offset:offset + limit]` but the records `exclude` names, and their record
    indices; counts what was read, excluded, malformed or empty into `stats` and hashes the conversations into
    `digest`."""
    conversations, indices, first_invalid = [], [], None
    for index, record in iter_records(source, offset, limit):
        stats.read += 1
        if index in exclude:
            stats.excluded += 1
            continue
        try:
            messages = training_messages(record, system_prompt)
        except ValueError as error:
            stats.invalid += 1
            first_invalid = first_invalid or f"record {index}: {error}"
            logger.debug(f"Skipping record {index}: {error}")
            continue
        if not messages:
            stats.empty += 1
            continue
        conversations.append(messages)
        indices.append(index)
        digest.update(json.dumps(messages).encode())
    if first_invalid is not None:  # a whole dataset in an unexpected layout must not shrink silently
        logger.warning(f"{source!r:.100}: skipped {stats.invalid} malformed records; the first, {first_invalid}")
    if not conversations:
        raise ValueError(f"No usable conversation in {source!r:.100} (offset={offset}, limit={limit}): {stats}.")
    return conversations, indices


def _warn_plain_text_loss(plain_text_loss: str) -> None:
    """Say which tokens take the loss when a tokenizer without chat template renders plain text, and how to change
    it."""
    covered = {"all": "every token after BOS (users' text too)", "assistant": "only the assistant turns' text"}
    other = "assistant" if plain_text_loss == "all" else "all"
    logger.warning(
        f"The tokenizer has no chat template: conversations are rendered as plain text (contents joined by blank "
        f"lines) and the loss covers {covered[plain_text_loss]} (plain_text_loss={plain_text_loss!r}). To change it "
        f"pass plain_text_loss={other!r} (CLI: --plain_text_loss {other}), or give the tokenizer a chat template."
    )


def _tally_rows(columns: dict[str, list], stats: DataStats) -> list[int]:
    """The rows to keep (kept or truncated), after adding each row's status and token counts to `stats`."""
    keep = [i for i, status in enumerate(columns["status"]) if status in ("kept", "truncated")]
    for name in ("truncated", "dropped", "invalid"):
        setattr(stats, name, getattr(stats, name) + columns["status"].count(name))
    stats.kept = len(keep)
    for name, column in (("approximate", "approximate"), ("tokens", "num_tokens"), ("loss_tokens", "num_loss_tokens")):
        setattr(stats, name, int(sum(columns[column][i] for i in keep)))
    return keep


def build_training_dataset(
    source,
    tokenizer,
    max_length: int = 2048,
    overflow: str = "drop",
    num_proc: int | None = None,
    offset: int = 0,
    limit: int | None = None,
    system_prompt: str | None = None,
    plain_text_loss: str = "all",
    exclude: Iterable[int] = (),
) -> "Dataset":
    """Build the EAGLE-3 training set: a `datasets.Dataset` with `input_ids` and `loss_mask` (`list[int]` each).

    Args:
        source: a JSON/JSONL file, `"sharegpt"` (the shipped, cut-off ShareGPT file), a `datasets.Dataset` or a
            list of records, in ShareGPT (`conversations`/`from`/`value`) or chat (`messages`/`role`/`content`)
            form. Records are cleaned by `normalize_messages`; trailing user turns are dropped.
        tokenizer: the target's tokenizer. Its chat template renders each conversation; `loss_mask[i]` is 1 iff
            token `i` belongs to an assistant turn's content or end-of-turn marker. Without a chat template see
            `render_plain_text`.
        max_length (`int`, defaults to 2048): longest sample in tokens.
        overflow (`str`, defaults to `"drop"`): `"drop"` drops longer samples (the official EAGLE recipe, and
            `eagle3-hf train`'s default); `"truncate"` cuts them to `max_length`.
        num_proc (`int`, *optional*): processes for rendering and tokenisation (`datasets.Dataset.map`).
        offset, limit: use records `[offset, offset + limit)` of the source, e.g. to keep a held-out slice out.
        system_prompt (`str`, *optional*): system message prepended to conversations that have none.
        plain_text_loss (`str`, defaults to `"all"`): for a tokenizer without chat template, `"all"` or
            `"assistant"` (see `render_plain_text`).
        exclude (`Iterable[int]`, *optional*): record indices (counted from the source's start) to leave out, e.g.
            those `screen_training_records` finds overlapping the evaluation prompts.

    Returns:
        The dataset; its `DataStats` (counts of records read, kept, truncated, dropped, empty, invalid, excluded) are
        logged and stored in `dataset.info.description`: read them with `DataStats.from_dataset(dataset)`. The
        dataset's fingerprint hashes the cleaned conversations, the tokenizer and these settings.
    """
    from datasets import Dataset

    if overflow not in ("truncate", "drop"):
        raise ValueError(f"overflow={overflow!r}; expected 'truncate' or 'drop'.")
    if max_length < 2:
        raise ValueError(f"max_length={max_length} must be at least 2.")
    stats, digest = DataStats(), hashlib.sha256()
    conversations, indices = _read_conversations(source, offset, limit, system_prompt, stats, digest, set(exclude))
    if tokenizer.chat_template is None:  # the loss mask then depends on a choice the user may not know exists
        _warn_plain_text_loss(plain_text_loss)
    settings = [_FORMAT_VERSION, tokenizer_fingerprint(tokenizer), max_length, overflow, plain_text_loss]
    digest.update(json.dumps(settings).encode())
    fingerprint = digest.hexdigest()[:16]

    dataset = Dataset.from_dict({"messages": conversations, "index": indices}).map(
        _tokenize_batch,
        batched=True,
        batch_size=256,
        num_proc=num_proc,
        remove_columns=["messages", "index"],
        fn_kwargs=dict(tokenizer=tokenizer, max_length=max_length, overflow=overflow, plain_text_loss=plain_text_loss),
        new_fingerprint=f"{fingerprint}-tokenized",
        desc="Tokenizing conversations",
    )
    columns = dataset.select_columns(["status", "approximate", "num_tokens", "num_loss_tokens"]).to_dict()
    keep = _tally_rows(columns, stats)
    stats.fingerprint = fingerprint
    dataset = dataset.select(keep, new_fingerprint=f"{fingerprint}-selected")
    dataset = dataset.remove_columns(list(columns), new_fingerprint=fingerprint)
    dataset.info.description = stats.to_json()
    logger.info(f"Training data: {stats}")
    if stats.approximate:
        logger.warning(
            f"{stats.approximate} samples: the chat template renders earlier turns differently from a "
            "conversation's end, so their assistant spans were found by search (see docs/training-data.md)."
        )
    return dataset


# --------------------------------------------------------------------------------------------------- collator


@dataclass
class DataCollatorForEagle3(DataCollatorMixin):
    """Right-pad rows of `input_ids` / `loss_mask` into a batch for EAGLE-3 training.

    Each example is a dict with `input_ids` and `loss_mask` (`list[int]` or 1-D tensors of length `T_i`). The batch
    holds `input_ids` (long `[B, T]`, padded with `pad_token_id`), `attention_mask` (long `[B, T]`, 1 on real
    tokens, computed from the lengths) and `loss_mask` (long `[B, T]`, padded with 0), with `T = max_i T_i`
    (rounded up to `pad_to_multiple_of`). Every other key must hold a per-token value, with length `T_i` along its
    first axis (e.g. precomputed target features `[T_i, 3 * H_t]`): it is padded with zeros to `[B, T, ...]`,
    keeping its dtype. Other columns raise `ValueError`; remove them from the dataset first.

    Args:
        pad_token_id (`int`, *optional*, defaults to 0):
            Id written into padded `input_ids` positions (the official recipe pads with zeros; they are masked).
        pad_to_multiple_of (`int`, *optional*):
            Round the padded length up to a multiple of this.
        return_tensors (`str`, *optional*, defaults to `"pt"`):
            Only `"pt"` is supported.

    Example:

    ```python
    >>> from eagle3_hf.training.data import DataCollatorForEagle3
    >>> collator = DataCollatorForEagle3(pad_token_id=0)
    >>> batch = collator([
    ...     {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "scores": [0.5, 1.0, 2.0]},
    ...     {"input_ids": [8, 9], "loss_mask": [0, 1], "scores": [3.0, 4.0]},
    ... ])
    >>> batch["input_ids"]
    tensor([[5, 6, 7],
            [8, 9, 0]])
    >>> batch["attention_mask"]
    tensor([[1, 1, 1],
            [1, 1, 0]])
    >>> batch["loss_mask"]
    tensor([[0, 1, 1],
            [0, 1, 0]])
    >>> batch["scores"]
    tensor([[0.5000, 1.0000, 2.0000],
            [3.0000, 4.0000, 0.0000]])

    ```
    """

    pad_token_id: int = 0
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples or "input_ids" not in examples[0] or "loss_mask" not in examples[0]:
            raise ValueError(
                "DataCollatorForEagle3 needs a non-empty list of examples with 'input_ids' and 'loss_mask'."
            )
        lengths = [len(example["input_ids"]) for example in examples]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {key: self._pad_column(examples, key, lengths, width) for key in examples[0]}
        batch["input_ids"], batch["loss_mask"] = batch["input_ids"].long(), batch["loss_mask"].long()
        batch["attention_mask"] = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
        return batch

    def _pad_column(self, examples: list[dict[str, Any]], key: str, lengths: list[int], width: int) -> torch.Tensor:
        """Stack one per-token column into `[B, width, ...]`, padding with `pad_token_id` (input_ids) or 0."""
        try:
            rows = [torch.as_tensor(example[key]) for example in examples]
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"Column {key!r} is not numeric; remove it before collating.") from error
        for row, length in zip(rows, lengths):
            if row.ndim == 0 or row.shape[0] != length:
                raise ValueError(
                    f"Column {key!r} has shape {tuple(row.shape)} in a row whose input_ids has length "
                    f"{length}; only per-token columns (first axis = sequence) can be collated."
                )
        padded = rows[0].new_full(
            (len(rows), width, *rows[0].shape[1:]), self.pad_token_id if key == "input_ids" else 0
        )
        for index, row in enumerate(rows):
            padded[index, : row.shape[0]] = row
        return padded
