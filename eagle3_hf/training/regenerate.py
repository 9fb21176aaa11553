"""Regenerate chat data with the target itself: the target answers every user turn of each conversation.

EAGLE-3 is trained on the target's own answers (the paper regenerates ShareGPT/UltraChat responses), so the draft
learns the distribution it will have to predict. Multi-turn conversations keep their user turns and feed the
target's previous answers back. Output is JSONL, one conversation per line, flushed per line, so an interrupted
run resumes where it stopped (`completed_indices`); a resumed run must use the same model, dtype, decoding and
data.
"""

import copy
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig

from .records import first_user_turn, iter_records, normalize_messages, read_appended_records, unused_sibling


logger = logging.getLogger(__name__)


@dataclass
class RegenerationStats:
    """Counts from `regenerate`. `skipped_done`: conversations already in the output file; `skipped_empty`: records
    without a user turn (or whose first prompt leaves no room for an answer within `max_length`); `invalid`:
    malformed records; `skipped_short`: records with fewer user turns than `min_turns`; `new_tokens`: tokens
    generated (through the first end-of-turn token); `seconds`: time spent generating."""

    written: int = 0
    skipped_done: int = 0
    skipped_empty: int = 0
    invalid: int = 0
    skipped_short: int = 0
    turns: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


@dataclass
class _Conversation:
    """One conversation being regenerated: its user turns, and the messages answered so far."""

    index: int
    id: Any
    user_turns: list[str]
    messages: list[dict[str, str]]  # the optional system message, then user/assistant pairs
    finish_reasons: list[str] = field(default_factory=list)
    done: bool = False

    def next_prompt(self) -> list[dict[str, str]]:
        return self.messages + [{"role": "user", "content": self.user_turns[len(self.finish_reasons)]}]

    def add_reply(self, text: str, finish_reason: str) -> None:
        if not text.strip():  # an empty answer would vanish when the data is read back; end the conversation here
            self.done = True
            return
        self.messages = self.next_prompt() + [{"role": "assistant", "content": text}]
        self.finish_reasons.append(finish_reason)
        self.done = len(self.finish_reasons) == len(self.user_turns)

    def to_record(self, model_name: str, dtype: str, decoding: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "messages": self.messages,
            "finish_reasons": self.finish_reasons,
            "model": model_name,
            "dtype": dtype,
            "decoding": decoding,
        }


def completed_indices(path: str | os.PathLike) -> set[int]:
    """Source indices already written to a regeneration output file.

    A last line without its newline is what an interrupted run leaves: it is never read as a record, and it is cut
    off the file so that appending starts on a fresh line. A complete line that is not a JSON record with an
    `index` raises `ValueError` naming the file and line.
    """
    return set(_completed_records(path))


def _completed_records(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """`completed_indices`, each with the record's `model`, `dtype`, `decoding` and first user turn (what a resumed
    run must match; `None` for a field that records written by older versions lack)."""
    records = read_appended_records(path, "regeneration record")
    return {
        int(record["index"]): {
            "model": record.get("model"),
            "dtype": record.get("dtype"),
            "decoding": record.get("decoding"),
            "user": first_user_turn(record),
        }
        for record in records
    }


def model_dtype(model) -> str:
    """The name of the dtype `model` computes in (`"float32"`, `"bfloat16"`, ...), as regeneration records it."""
    return str(model.dtype).removeprefix("torch.")


def decoding_settings(generation_config: GenerationConfig) -> dict[str, Any]:
    """How the answers are decoded, as regeneration records it: `{"do_sample": False}` (greedy) or the sampling
    settings that shape the distribution (`temperature`, `top_p`, `top_k`; `top_k` 0: off, `None`: `generate`'s
    default of 50)."""
    if not generation_config.do_sample:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": generation_config.temperature,
        "top_p": generation_config.top_p,
        "top_k": generation_config.top_k,
    }


def _mixed_output_error(path: str | os.PathLike, field: str, written: Any, current: Any) -> ValueError:
    """The error for a resumed run whose model or data is not the one the output file was written with."""
    return ValueError(
        f"{path} holds conversations with another {field}: {written!r:.80} there, {current!r:.80} in this run. "
        f"Resuming would mix both in one training file; write to a new --output (e.g. {unused_sibling(path)}) or "
        f"delete {path}."
    )


def _eos_token_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("Neither the model's generation_config nor the tokenizer defines an eos_token_id.")
    return ids


def generate_replies(
    model,
    tokenizer,
    prompts: list[list[int]],
    generation_config: GenerationConfig,
    max_new_tokens: list[int] | None = None,
    echo_tokens: list[int] | None = None,
) -> list[tuple[str, int, str]]:
    """Answer a batch of tokenised prompts with one left-padded `generate` call.

    Returns `(text, new_tokens, finish_reason)` per prompt: the reply decoded up to its first end-of-turn token
    (excluded), the number of tokens generated through that token, and `"stop"` or `"length"`. `max_new_tokens`
    caps each prompt's reply below `generation_config.max_new_tokens` (the call runs for the largest cap; a reply
    is what generating with its own cap gives). `echo_tokens` decodes each prompt's last `n` tokens in front of its
    reply, in one `decode` with it (a tokenizer may drop a leading space when the reply is decoded alone); they do
    not count as new tokens.
    """
    pad_id = generation_config.pad_token_id
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):  # left padding: every prompt ends where generation starts
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    limits = [None] * len(prompts)
    if max_new_tokens is not None:
        cap = generation_config.max_new_tokens
        limits = [limit if cap is None else min(limit, cap) for limit in max_new_tokens]
        generation_config = copy.deepcopy(generation_config)
        generation_config.max_new_tokens = max(limits)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            generation_config=generation_config,
        )
    eos = torch.tensor(generation_config.eos_token_id, device=output.device)
    replies = []
    echo_tokens = [0] * len(prompts) if echo_tokens is None else echo_tokens
    for row, limit, echo in zip(output, limits, echo_tokens):
        echoed, row = row[width - echo : width], row[width:][:limit]
        stops = torch.isin(row, eos).nonzero()
        end = int(stops[0]) if len(stops) else row.shape[0]
        ids = torch.cat([echoed, row[:end]])
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        replies.append((text, min(end + 1, row.shape[0]), "stop" if len(stops) else "length"))
    return replies


def _start_conversation(
    index: int, record: Any, stats: RegenerationStats, max_turns: int | None, min_turns: int = 1
) -> _Conversation | None:
    try:
        messages = normalize_messages(record)
    except ValueError as error:
        stats.invalid += 1
        logger.debug(f"Skipping record {index}: {error}")
        return None
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    user_turns = [message["content"] for message in messages if message["role"] == "user"]
    if not user_turns:
        stats.skipped_empty += 1
        return None
    if len(user_turns) < min_turns:
        stats.skipped_short += 1
        return None
    user_turns = user_turns[:max_turns]
    record_id = record.get("id", index) if isinstance(record, dict) else index
    return _Conversation(index, record_id, user_turns, system)


def make_generation_config(
    model,
    tokenizer,
    max_new_tokens: int = 512,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    cache_implementation: str | None = None,
) -> GenerationConfig:
    """Greedy (default) or sampled decoding that stops at any of the model's or tokenizer's EOS ids.

    Sampling draws from the whole distribution unless `top_k` / `top_p` cut it: `top_k=0` is passed as such, since
    `generate` fills an unset `top_k` with its global default of 50.

    `cache_implementation` goes to `GenerationConfig` (`None`: the dynamic cache; `"static"` preallocates the KV
    cache per `generate` call, which on CPU avoids re-concatenating every layer's cache at every step).
    """
    eos = _eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k) if do_sample else {}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        eos_token_id=eos,
        pad_token_id=pad,
        cache_implementation=cache_implementation,
        **sampling,
    )


def regenerate(
    model,
    tokenizer,
    source,
    output_path: str | os.PathLike,
    generation_config: GenerationConfig | None = None,
    offset: int = 0,
    limit: int | None = None,
    batch_size: int = 8,
    max_length: int = 2048,
    max_turns: int | None = None,
    min_turns: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> RegenerationStats:
    """Answer every user turn of `source[offset : offset + limit]` with `model`; append conversations to a JSONL file.

    Args:
        model, tokenizer: the target and its tokenizer (which needs a chat template).
        source: anything `eagle3_hf.training.records.iter_records` reads (a file, `"sharegpt"`, a
            `datasets.Dataset`, a list).
            Assistant turns in it are discarded; user turns (and a leading system message) are kept.
        output_path: JSONL output. Each line is `{"index", "id", "messages", "finish_reasons", "model", "dtype",
            "decoding"}`, where `index` is the record's position in the source, `dtype` the one the model computed
            in (its answers differ with it: a bfloat16 SmolLM2 answers differently from float32 after a third of
            the answer on average) and `decoding` greedy or the sampling settings (`decoding_settings`).
            Conversations already in the file are skipped (resume); `ValueError` if the file was written by another
            model (`model.name_or_path`), in another dtype or with other decoding settings, or holds another first
            user turn at an index of this run (other data). Records of older versions carry no `dtype` or
            `decoding` and are not checked for them.
        generation_config: from `make_generation_config` (greedy, 512 new tokens by default).
        offset, limit: the slice of the source to regenerate (keep a held-out slice out of training this way).
        batch_size: conversations answered per `generate` call (left padding); finished ones are replaced at once.
            Conversations are processed shortest first prompt first, so the output is not in source order.
        max_length: the longest conversation in tokens, counted as training counts them (the chat template's render,
            the tokens that close the turn included): each answer is cut to the room left (finish reason
            `"length"`), and a conversation ends before a turn that has no room left. Use train's `max_length`.
        max_turns: answer only the first `max_turns` user turns of each conversation (default: all). A batch waits
            for its longest answer, so multi-turn conversations cost one batch per turn.
        min_turns: skip the records with fewer user turns than this (counted in `stats.skipped_short`, not
            written). With `min_turns=2` a run adds only conversations that have later turns to learn from, next to
            a file that already holds the first turns of the same records.
        seed: seeds sampling (`transformers.set_seed`); with batching, a resumed run is not bit-identical.
    """
    from tqdm.auto import tqdm
    from transformers import set_seed

    if tokenizer.chat_template is None:
        raise ValueError("Regeneration needs a tokenizer with a chat template to build prompts.")
    if min_turns < 1 or (max_turns is not None and max_turns < min_turns):
        raise ValueError(f"`min_turns` must be at least 1 and at most `max_turns` ({max_turns}), got {min_turns}.")
    set_seed(seed)
    generation_config = generation_config or make_generation_config(model, tokenizer)
    done = _completed_records(output_path)
    if other_models := sorted({r["model"] for r in done.values()} - {None, model.name_or_path}):
        raise _mixed_output_error(output_path, "'model'", other_models[0], model.name_or_path)
    dtype = model_dtype(model)
    if other_dtypes := sorted({r["dtype"] for r in done.values()} - {None, dtype}):
        raise _mixed_output_error(output_path, "'dtype'", other_dtypes[0], dtype)
    decoding = decoding_settings(generation_config)
    if other := next((r["decoding"] for r in done.values() if r["decoding"] not in (None, decoding)), None):
        raise _mixed_output_error(output_path, "'decoding'", other, decoding)
    stats = RegenerationStats()
    conversations = []
    for index, record in iter_records(source, offset, limit):
        if index in done:
            if done[index]["user"] != (user := first_user_turn(record)):
                field = f"data source (the first user turn in 'messages' at index {index})"
                raise _mixed_output_error(output_path, field, done[index]["user"], user)
            stats.skipped_done += 1
        elif (conversation := _start_conversation(index, record, stats, max_turns, min_turns)) is not None:
            conversations.append(conversation)
    # A batch pads to its longest prompt, and prefilling is most of a batch's cost on CPU (SmolLM2-135M, 2 cores:
    # 800 prompt tokens/s against 140 generated tokens/s at batch 32); similar prompt lengths waste the least. The
    # output order does not matter (`index`).
    conversations.sort(key=lambda c: sum(len(m["content"]) for m in c.next_prompt()))
    pending, active = iter(conversations), []
    with (
        open(output_path, "a", encoding="utf-8") as output,
        tqdm(total=len(conversations), disable=not progress, desc="Regenerating", unit="conversation") as bar,
    ):
        while True:
            active += itertools.islice(pending, batch_size - len(active))
            if not active:
                break
            _answer_next_turns(model, tokenizer, active, generation_config, max_length, stats)
            for conversation in (c for c in active if c.done):
                if conversation.finish_reasons:
                    output.write(
                        json.dumps(conversation.to_record(model.name_or_path, dtype, decoding), ensure_ascii=False)
                        + "\n"
                    )
                    output.flush()
                    stats.written += 1
                else:
                    stats.skipped_empty += 1
                bar.update(1)
            active = [c for c in active if not c.done]
            bar.set_postfix(tokens_per_s=f"{stats.tokens_per_second:.1f}")
    logger.info(f"Regeneration: {stats} ({stats.tokens_per_second:.1f} tokens/s)")
    return stats


def _chat_ids(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
    """`messages` rendered by the chat template and tokenised as training does (no special tokens added)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _fit_reply(tokenizer, prompt: list[dict[str, str]], text: str, max_length: int) -> str:
    """The longest prefix of `text` with which the conversation `prompt` + answer renders to `max_length` tokens at
    most. The generated tokens fit already; their decoded text can tokenise into more (a cut multi-byte character,
    or tokens the tokenizer would not produce itself)."""

    def fits(length: int) -> bool:
        return len(_chat_ids(tokenizer, prompt + [{"role": "assistant", "content": text[:length]}])) <= max_length

    if fits(len(text)):
        return text
    low, high = 0, len(text) - 1  # the longest prefix that fits has a length in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return text[:low]


def _answer_next_turns(model, tokenizer, active, generation_config, max_length: int, stats: RegenerationStats) -> None:
    """Generate the next assistant turn of every active conversation in one batch, each answer cut to the room that
    `max_length` leaves it once the template has closed the turn."""
    ready = []
    for conversation in active:
        prompt = conversation.next_prompt()
        ids = _chat_ids(tokenizer, prompt, add_generation_prompt=True)
        # An empty answer renders as the prompt plus the tokens that close the turn (`<|im_end|>\n` in ChatML).
        closed = _chat_ids(tokenizer, prompt + [{"role": "assistant", "content": ""}])
        room = max_length - max(len(ids), len(closed))
        if room < 1:
            conversation.done = True
        else:
            ready.append((conversation, ids, room))
    if not ready:
        return
    start = time.perf_counter()
    prompts, rooms = [ids for _, ids, _ in ready], [room for _, _, room in ready]
    replies = generate_replies(model, tokenizer, prompts, generation_config, rooms)
    stats.seconds += time.perf_counter() - start
    for (conversation, _, _), (text, new_tokens, finish_reason) in zip(ready, replies):
        fitted = _fit_reply(tokenizer, conversation.next_prompt(), text, max_length)
        conversation.add_reply(fitted, finish_reason if fitted == text else "length")
        stats.turns += 1
        stats.new_tokens += new_tokens
