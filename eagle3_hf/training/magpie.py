"""Magpie prompts: the target writes user prompts itself, from nothing but its chat template's user prefix.

Magpie (Xu et al. 2024, [arXiv 2406.08464](https://huggingface.co/papers/2406.08464)) prompts an aligned chat model
with only the text its chat template puts before a user message's content: `<|im_start|>user\\n` in ChatML (after the
template's default system message, if it writes one), `<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n`
in Llama 3. The model continues with a user prompt of the kind it was tuned on and ends it with its end-of-turn token.
`magpie_prompts` samples such prompts in batches, filters them (length, cut off, template markup, duplicates and
near-duplicates, overlap with the benchmark's evaluation sets) and appends them to a resumable JSONL file of chat
records, which `eagle3-hf regenerate --data FILE` then answers. `prompt_starts` steers the kind of request: each
row is prompted with the user prefix followed by the first words of a request ("Write a story", "Explain"), which
the model completes (the words are part of the kept prompt). See docs/training-data.md.
"""

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from transformers import GenerationConfig

from .exclusion import EvaluationIndex, normalize_words
from .records import read_appended_records, unused_sibling
from .regenerate import generate_replies, make_generation_config


logger = logging.getLogger(__name__)

# Stand in for a user message's content to find where the template puts it; two, to check that the text around
# the content does not depend on it. No whitespace, so templates that trim the content keep them whole.
_SENTINELS = ("<<eagle3-magpie-user-3b7d1a>>", "<<eagle3-magpie-user-9c2e4f>>")
# Rejection reasons, in the order the filters run.
REJECTIONS = (
    "cut_off",
    "markup",
    "too_short",
    "too_long",
    "duplicate",
    "near_duplicate",
    "evaluation_overlap",
)


def _tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


@dataclass(frozen=True)
class UserTurnTemplate:
    """How a chat template writes a conversation's first user message: `prefix` is the text before its content
    (what Magpie prompts the model with), `suffix` the text after it (`<|im_end|>\\n` in ChatML)."""

    prefix: str
    suffix: str

    @property
    def end_of_turn(self) -> str:
        """The suffix without surrounding whitespace: the end-of-turn marker (`<|im_end|>`, `<|eot_id|>`)."""
        return self.suffix.strip()


def user_turn_template(tokenizer, system_prompt: str | None = None) -> UserTurnTemplate:
    """Find the user prefix of `tokenizer`'s chat template, without assuming any template format.

    Renders a conversation of one user message (after a system message with `system_prompt`, if given) whose content
    is a sentinel, and cuts the render at the sentinel; a second sentinel checks that the text around the content
    does not depend on it. Raises `ValueError` naming the tokenizer when it has no chat template, the template
    raises, does not write the content verbatim, or writes nothing before it.
    """
    name = _tokenizer_name(tokenizer)
    if tokenizer.chat_template is None:
        raise ValueError(f"Tokenizer {name!r} has no chat template, so it has no user prefix to prompt Magpie with.")
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    parts = []
    for sentinel in _SENTINELS:
        conversation = [*system, {"role": "user", "content": sentinel}]
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
        except (TemplateError, ValueError) as error:
            raise ValueError(f"The chat template of tokenizer {name!r} rejects a user message: {error}") from error
        prefix, found, suffix = text.partition(sentinel)
        if not found:
            raise ValueError(
                f"Cannot find the user prefix of tokenizer {name!r}: its chat template does not write a user "
                f"message's content verbatim (rendered {text!r:.200})."
            )
        parts.append((prefix, suffix))
    if parts[0] != parts[1]:
        raise ValueError(
            f"Cannot find the user prefix of tokenizer {name!r}: the text its chat template writes around a user "
            f"message depends on the message ({parts[0][0]!r:.100} vs {parts[1][0]!r:.100})."
        )
    prefix, suffix = parts[0]
    if not prefix.strip():
        raise ValueError(
            f"Cannot find the user prefix of tokenizer {name!r}: its chat template writes nothing before a user "
            "message's content, so the model cannot tell a user prompt is expected."
        )
    return UserTurnTemplate(prefix, suffix)


def end_of_turn_ids(tokenizer, template: UserTurnTemplate) -> list[int]:
    """The token that ends a user turn (the first of `template.suffix`) when it is a special or added token, such as
    `<|im_end|>`; `[]` when the marker is plain text. Generation stops there as well as at the EOS ids."""
    ids = tokenizer(template.suffix.lstrip(), add_special_tokens=False)["input_ids"]
    if ids and (ids[0] in tokenizer.added_tokens_decoder or ids[0] in tokenizer.all_special_ids):
        return ids[:1]
    return []


class DuplicateFilter:
    """Exact and near-duplicate prompts, compared as normalised words (`eagle3_hf.training.exclusion.normalize_words`:
    case, punctuation and whitespace do not count).

    A prompt is a `"duplicate"` of a kept one with the same words, and a `"near_duplicate"` when the Jaccard
    similarity of their sets of word trigrams (the words themselves for prompts under three words) is at least
    `threshold`: changing one word of a 20-word prompt leaves 0.71, "Write a poem about cats" vs "... about dogs" is
    0.5. Kept prompts are indexed by trigram, so a check compares only with prompts that share one.

    Args:
        threshold (`float`, *optional*, defaults to 0.7): the near-duplicate similarity; `None` checks only exact
            duplicates.
    """

    def __init__(self, threshold: float | None = 0.7):
        self.threshold = threshold
        self._texts: set[str] = set()
        self._trigrams: list[frozenset[tuple[str, ...]]] = []
        self._postings: dict[tuple[str, ...], list[int]] = {}

    @staticmethod
    def _shingles(words: list[str]) -> frozenset[tuple[str, ...]]:
        return frozenset(zip(words, words[1:], words[2:])) if len(words) >= 3 else frozenset([tuple(words)])

    def check(self, text: str) -> str | None:
        """`"duplicate"`, `"near_duplicate"` or None for a prompt not like any added one."""
        words = normalize_words(text)
        if " ".join(words) in self._texts:
            return "duplicate"
        if self.threshold is None:
            return None
        shingles = self._shingles(words)
        shared = Counter(kept for shingle in shingles for kept in self._postings.get(shingle, ()))
        for kept, common in shared.items():
            if common / (len(shingles) + len(self._trigrams[kept]) - common) >= self.threshold:
                return "near_duplicate"
        return None

    def add(self, text: str) -> None:
        words = normalize_words(text)
        self._texts.add(" ".join(words))
        shingles = self._shingles(words)
        for shingle in shingles:
            self._postings.setdefault(shingle, []).append(len(self._trigrams))
        self._trigrams.append(shingles)


class PromptFilter:
    """The filters a sampled prompt must pass (see `REJECTIONS`); `reject_reason` names the first one it fails.

    Args:
        tokenizer: the target's tokenizer (lengths are counted by re-tokenising the prompt's text).
        template (`UserTurnTemplate`): the prompt must not contain its end-of-turn marker.
        min_tokens, max_tokens (`int`): the shortest and longest prompt kept, in tokens.
        near_duplicate_threshold (`float`, *optional*): see `DuplicateFilter`.
        evaluation_index (`EvaluationIndex`, *optional*): prompts that overlap it are rejected.
    """

    def __init__(
        self,
        tokenizer,
        template: UserTurnTemplate,
        min_tokens: int,
        max_tokens: int,
        near_duplicate_threshold: float | None = 0.7,
        evaluation_index: EvaluationIndex | None = None,
    ):
        self.tokenizer, self.min_tokens, self.max_tokens = tokenizer, min_tokens, max_tokens
        special = [token.content for token in tokenizer.added_tokens_decoder.values() if token.special]
        self.markup = sorted({*special, template.end_of_turn} - {""})
        self.duplicates = DuplicateFilter(near_duplicate_threshold)
        self.evaluation_index = evaluation_index

    def reject_reason(self, prompt: str, finish_reason: str = "stop") -> str | None:
        """Why `prompt` (stripped text) is rejected, or None to keep it. `finish_reason` is `generate_replies`'s:
        `"length"` means the prompt was cut off before its end-of-turn token."""
        if finish_reason == "length":
            return "cut_off"
        if any(marker in prompt for marker in self.markup):
            return "markup"  # the model wrote template markup (a new turn) instead of ending its prompt
        length = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
        if length < self.min_tokens:
            return "too_short"
        if length > self.max_tokens:
            return "too_long"
        if (duplicate := self.duplicates.check(prompt)) is not None:
            return duplicate
        if self.evaluation_index is not None and self.evaluation_index.matches(prompt):
            return "evaluation_overlap"
        return None


@dataclass
class MagpieStats:
    """Counts from `magpie_prompts`. `written`: prompts appended; `skipped_done`: prompts already in the file;
    `batches`, `candidates`: `generate` calls and prompts sampled in this run; `rejected`: candidates per reason
    (`REJECTIONS`); `new_tokens`, `seconds`: tokens generated and time spent generating."""

    written: int = 0
    skipped_done: int = 0
    batches: int = 0
    candidates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def _check_resume(path: str | os.PathLike, records: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """Raise `ValueError` if a record of `path` was written with other settings (`source`, `model`, ...)."""
    for record in records:
        for key, value in settings.items():
            if record.get(key) != value:
                raise ValueError(
                    f"{path} holds records written with another {key!r}: {record.get(key)!r:.80} there, "
                    f"{value!r:.80} in this run. Resuming would mix both in one file; write to a new --output "
                    f"(e.g. {unused_sibling(path)}) or delete {path}."
                )


def _batch_seed(seed: int, batch: int) -> int:
    """The seed of batch `batch`: a function of the run's seed and the batch number only, so that a resumed run
    samples the batches it had not reached as an uninterrupted run would (up to kernel nondeterminism)."""
    return (seed * 1_000_003 + batch) % 2**32


def make_magpie_generation_config(
    model,
    tokenizer,
    template: UserTurnTemplate,
    max_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    cache_implementation: str | None = None,
) -> GenerationConfig:
    """Sampling (greedy would write one prompt per batch) for `max_tokens + 1` tokens, room for a `max_tokens`
    prompt and its end-of-turn token; stops at the EOS ids and at the user turn's end-of-turn token.
    `top_k=0` disables top-k (transformers would otherwise apply its default of 50)."""
    config = make_generation_config(
        model, tokenizer, max_tokens + 1, True, temperature, top_p, top_k, cache_implementation=cache_implementation
    )
    config.eos_token_id = list(dict.fromkeys([*config.eos_token_id, *end_of_turn_ids(tokenizer, template)]))
    return config


def magpie_prompts(
    model,
    tokenizer,
    output_path: str | os.PathLike,
    num_prompts: int,
    batch_size: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_tokens: int = 3,
    max_tokens: int = 256,
    system_prompt: str | None = None,
    prompt_starts: Sequence[str] | None = None,
    near_duplicate_threshold: float | None = 0.7,
    evaluation_index: EvaluationIndex | None = None,
    seed: int = 0,
    max_batches: int | None = None,
    cache_implementation: str | None = None,
    progress: bool = True,
) -> MagpieStats:
    """Sample user prompts from `model` until `output_path` holds `num_prompts` of them that pass the filters.

    Each batch is one `generate` call on a `[batch_size, P]` long tensor: the P ids of the user prefix
    (`user_turn_template`), the same in every row, or with `prompt_starts` the prefix and one start per row
    (`generate_replies` left-pads the shorter rows). Rows stop at an EOS or end-of-turn id. Candidates are stripped
    and filtered by `PromptFilter`, in this order: cut off by `max_tokens`, template markup, shorter than
    `min_tokens` or longer than `max_tokens` tokens, a duplicate or near-duplicate (`DuplicateFilter`) of a prompt
    kept earlier (in this run or in the file), overlapping the evaluation sets (`EvaluationIndex`).

    Args:
        model, tokenizer: the target and its tokenizer (which needs a chat template).
        output_path: JSONL output, one line per kept prompt, flushed as it is written: `{"index", "id", "messages",
            "model", "source": "magpie", "seed", "batch", "prefix", ...the other settings}`. `messages` is
            `[{"role": "user", "content": prompt}]`, after the system message when `system_prompt` is given.
            Rerunning with the same file resumes; a file written with another model or other settings raises
            `ValueError` naming the file and the field.
        num_prompts: how many prompts the file should hold.
        batch_size: prompts sampled per `generate` call.
        temperature, top_p, top_k: sampling (`make_magpie_generation_config`); Magpie samples at temperature 1.
        min_tokens, max_tokens: the prompt lengths kept, in tokens.
        system_prompt: a system message before the user turn (default: none, so the template's default system
            message, if it writes one, is part of the prefix).
        prompt_starts: the opening words of the prompts, e.g. `["Write a story", "Explain"]` (default: none, plain
            Magpie). Candidate `i` of batch `b` starts with `prompt_starts[(b * batch_size + i) % len(prompt_starts)]`
            and the model writes the rest; the start is part of the prompt, and each record names it
            (`"prompt_start"`). A start must not end with whitespace (the model writes the space after it).
        near_duplicate_threshold: see `DuplicateFilter`.
        evaluation_index: the prompts to keep out (default: `EvaluationIndex.from_benchmarks()`, the benchmark's
            MT-bench, HumanEval and held-out ShareGPT prompts); `EvaluationIndex([])` checks nothing.
        seed: batch `b` samples with seed `(seed, b)` (`_batch_seed`). A resumed run restarts at the last batch in
            the file, whose kept prompts come out again and are skipped.
        max_batches: stop (with a warning) after this many batches in all, counted from the file's first (default:
            10 * num_prompts / batch_size), in case the model repeats itself more than the filters allow.
        cache_implementation: see `eagle3_hf.training.regenerate.make_generation_config`.
    """
    from tqdm.auto import tqdm
    from transformers import set_seed

    if batch_size < 1 or not 1 <= min_tokens <= max_tokens:
        raise ValueError(
            f"Need batch_size >= 1 and 1 <= min_tokens <= max_tokens; got batch_size={batch_size}, "
            f"min_tokens={min_tokens}, max_tokens={max_tokens}."
        )
    starts = list(prompt_starts) if prompt_starts else []
    bad = [start for start in starts if not start.strip() or start != start.rstrip()]
    if bad:
        raise ValueError(
            f"prompt_starts must be non-empty and not end with whitespace (the model writes the space after a start); "
            f"got {bad!r}."
        )
    template = user_turn_template(tokenizer, system_prompt)
    evaluation_index = EvaluationIndex.from_benchmarks() if evaluation_index is None else evaluation_index
    # What every record carries and a resumed run must repeat, in the order records list them.
    settings = dict(source="magpie", model=model.name_or_path, seed=seed, prefix=template.prefix)
    settings |= dict(temperature=temperature, top_p=top_p, top_k=top_k, min_tokens=min_tokens, max_tokens=max_tokens)
    settings |= dict(near_duplicate_threshold=near_duplicate_threshold, evaluation_sets=evaluation_index.datasets)
    written = read_appended_records(output_path, "prompt record")
    # A plain run must not resume a steered file (nor the reverse); plain records carry no `prompt_starts`, as
    # files written before the option existed.
    _check_resume(output_path, written, {**settings, "prompt_starts": starts or None})
    if starts:
        settings["prompt_starts"] = starts
    filters = PromptFilter(tokenizer, template, min_tokens, max_tokens, near_duplicate_threshold, evaluation_index)
    for record in written:
        filters.duplicates.add(record["messages"][-1]["content"])
    first_batch = max((record.get("batch", 0) for record in written), default=0)
    redone = {record["messages"][-1]["content"] for record in written if record.get("batch", 0) == first_batch}
    max_batches = max_batches if max_batches is not None else 10 * math.ceil(num_prompts / batch_size)
    config = make_magpie_generation_config(
        model, tokenizer, template, max_tokens, temperature, top_p, top_k, cache_implementation
    )
    prefix_ids = tokenizer(template.prefix, add_special_tokens=False)["input_ids"]
    # Prefix and start tokenised together, as the chat template's text would be; the start's tokens are echoed
    # in front of the reply so that the kept prompt reads as the model's tokenizer joins them.
    start_ids = [tokenizer(template.prefix + start, add_special_tokens=False)["input_ids"] for start in starts]
    for start, ids in zip(starts, start_ids):
        if ids[: len(prefix_ids)] != prefix_ids:
            raise ValueError(
                f"The prompt start {start!r} merges with the user prefix's last token; start it otherwise."
            )
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    stats = MagpieStats(skipped_done=len(written), rejected=dict.fromkeys(REJECTIONS, 0))
    count, next_index = len(written), max((record["index"] for record in written), default=-1) + 1
    with (
        open(output_path, "a", encoding="utf-8") as output,
        tqdm(total=num_prompts, initial=count, disable=not progress, desc="Magpie", unit="prompt") as bar,
    ):
        for batch in range(first_batch, max_batches):
            if count >= num_prompts:
                break
            set_seed(_batch_seed(seed, batch))
            row_starts = [(batch * batch_size + row) % len(starts) for row in range(batch_size)] if starts else []
            inputs = [start_ids[index] for index in row_starts] or [prefix_ids] * batch_size
            echo = [len(ids) - len(prefix_ids) for ids in inputs]
            began = time.perf_counter()
            replies = generate_replies(model, tokenizer, inputs, config, echo_tokens=echo)
            stats.seconds += time.perf_counter() - began
            stats.batches += 1
            stats.candidates += len(replies)
            stats.new_tokens += sum(new_tokens for _, new_tokens, _ in replies)
            for row, (text, _, finish_reason) in enumerate(replies):
                prompt = text.strip()
                if (reason := filters.reject_reason(prompt, finish_reason)) is not None:
                    if not (reason == "duplicate" and batch == first_batch and prompt in redone):
                        stats.rejected[reason] += 1
                    continue
                if count >= num_prompts:
                    continue
                filters.duplicates.add(prompt)
                messages = [*system, {"role": "user", "content": prompt}]
                record = {"index": next_index, "id": f"magpie-{next_index}", "messages": messages, **settings}
                if starts:
                    record["prompt_start"] = starts[row_starts[row]]
                output.write(json.dumps({**record, "batch": batch}, ensure_ascii=False) + "\n")
                output.flush()
                stats.written, count, next_index = stats.written + 1, count + 1, next_index + 1
                bar.update(1)
            bar.set_postfix(sampled=stats.candidates)
    if count < num_prompts:
        logger.warning(
            f"Stopped after max_batches={max_batches} batches with {count} of {num_prompts} prompts in "
            f"{output_path}; rejected: {stats.rejected}. Rerun with a larger max_batches (or other filters) for more."
        )
    logger.info(f"Magpie: {stats} ({stats.tokens_per_second:.1f} tokens/s)")
    return stats
