"""Reading chat records: JSON / JSONL files (streamed, cut-off files recovered), datasets or lists, normalised.

Records come in ShareGPT form (`{"conversations": [{"from": "human", "value": ...}, ...]}`) or chat form
(`{"messages": [{"role": "user", "content": ...}, ...]}`), from JSON/JSONL files (streamed record by record, so a
cut-off file such as the shipped ShareGPT yields every complete record), `datasets.Dataset`s or in-memory lists.
`normalize_messages` turns each into `[{"role", "content"}]` with the roles chat templates expect. Rendering and
loss masks are `eagle3_hf.training.data`. See docs/training-data.md.
"""

import codecs
import gzip
import itertools
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)

# Role names seen in ShareGPT-style dumps and chat datasets -> the roles chat templates expect.
ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
# Stands in for an assistant message's content to find where a template puts it; long and odd so real text
# never contains it.
_READ_CHUNK = 1 << 20


def _decode_cut_last_line(path: Path, file, error: UnicodeDecodeError, lines_read: int) -> tuple[str, int]:
    """Handle bytes of `file` that are not UTF-8 (`error`, from decoding `error.object` after `lines_read` lines).

    In the last line of a file without a final newline they are what a cut inside a multi-byte character leaves:
    returns the text decoded before them and the number of bytes left out (they and the rest of the file), so the
    reader treats that line as any other cut-off one. Anywhere else raises `ValueError` naming the file and line.
    """
    data, dropped = error.object, len(error.object) - error.start
    newline = b"\n" in data[error.start :]
    while not newline and (rest := file.read(_READ_CHUNK)):
        newline, dropped = b"\n" in rest, dropped + len(rest)
    if newline:
        line = lines_read + data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}:{line} is not valid UTF-8 ({error.reason}).") from error
    return data[: error.start].decode("utf-8"), dropped


def iter_json_records(path: str | os.PathLike) -> Iterator[Any]:
    """Stream the records of a JSON array file or a JSONL file (optionally `.gz`), one at a time.

    A file cut off mid-record (the shipped ShareGPT file is), even inside a multi-byte UTF-8 character, yields every
    complete record, then logs a warning with the count read; it never raises for that. A record that is not valid
    JSON with more of the file after it, and bytes that are not UTF-8 before the last line, raise `ValueError` naming
    the file and line. Memory stays around one record plus a 1 MiB
    read buffer.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    decoder = json.JSONDecoder()
    count = 0
    # Bytes, decoded here rather than by a text-mode file: a strict text-mode read raises a bare UnicodeDecodeError
    # when the file is cut inside a character, and it cannot tell where the bad bytes are.
    with opener(path, "rb") as file:
        utf8 = codecs.getincrementaldecoder("utf-8")()
        buffer, position, at_eof, lines_read, dropped = "", 0, False, 0, 0
        lines_before_buffer = 0  # newlines in the text already dropped from the buffer, for error messages

        def refill() -> bool:
            nonlocal buffer, position, at_eof, lines_read, dropped, lines_before_buffer
            raw = file.read(_READ_CHUNK) if not at_eof else b""
            try:
                chunk = utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as error:
                (chunk, dropped), raw = _decode_cut_last_line(path, file, error, lines_read), b""
            lines_read += raw.count(b"\n")
            lines_before_buffer += buffer.count("\n", 0, position)
            buffer, position, at_eof = buffer[position:] + chunk, 0, not raw
            return bool(raw)

        def skip(chars: str) -> None:
            nonlocal position
            while True:
                while position < len(buffer) and buffer[position] in chars:
                    position += 1
                if position < len(buffer) or not refill():
                    return

        skip(" \t\r\n\ufeff")
        if position < len(buffer) and buffer[position] == "[":  # a JSON array; otherwise JSONL (records in a row)
            position += 1
        elif position < len(buffer) and buffer[position] != "{":
            raise ValueError(
                f"{path}: expected a JSON array of records or JSONL records, found "
                f"{buffer[position : position + 20]!r} at the start."
            )
        while True:
            skip(" \t\r\n,")
            if position >= len(buffer) or buffer[position] == "]":
                break
            try:
                record, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as error:
                # A record that merely runs past the buffer (or the file) fails where the text ends (an unterminated
                # string: where it starts, on the same line); a failure with more lines after it is a bad record.
                if "\n" in buffer[error.pos :].rstrip():
                    line = lines_before_buffer + buffer.count("\n", 0, error.pos) + 1
                    raise ValueError(
                        f"{path}:{line} is not valid JSON ({error.msg}), and more of the file follows it; only a "
                        f"record cut off at the end of the file is skipped. Read {count} records before it."
                    ) from error
                if refill():  # the record continues past the buffer
                    continue
                logger.warning(
                    f"{path} is truncated or malformed: read {count} complete records, then could not "
                    f"decode the rest ({len(buffer) - position} characters: {error.msg}); ignoring it."
                )
                return
            position = end
            count += 1
            yield record
    if dropped:  # the cut left nothing but part of a character on the last line
        logger.warning(
            f"{path} is truncated: read {count} complete records, then {dropped} bytes that are not UTF-8 "
            "(a cut inside a character); ignoring them."
        )
        return
    logger.info(f"Read {count} records from {path}.")


def read_appended_records(path: str | os.PathLike, kind: str) -> list[dict[str, Any]]:
    """The records of a JSONL file that a resumable job (`regenerate`, `magpie`) appends to, one per line.

    A last line without its newline is what an interrupted run leaves: it is never read as a record, and it is cut
    off the file so that appending starts on a fresh line. A complete line that is not a JSON record with an integer
    `index` raises `ValueError` naming the file, the line and `kind` (what the record should be). A missing file
    holds no records.
    """
    path = Path(path)
    if not path.is_file():
        return []
    records, complete_bytes = [], 0
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith(b"\n"):
                logger.warning(f"{path}: ignoring the partial last line {number} left by an interrupted run.")
                break
            try:
                record = json.loads(line)
                int(record["index"])
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number} is not a {kind} with an 'index': {error}") from error
            records.append(record)
            complete_bytes += len(line)
    if complete_bytes != path.stat().st_size:
        os.truncate(path, complete_bytes)
    return records


def unused_sibling(path: str | os.PathLike) -> Path:
    """The first of `out-2.jsonl`, `out-3.jsonl`, ... next to `out.jsonl` that does not exist: where to write
    instead of mixing two runs in one file."""
    path = Path(path)
    candidates = (path.with_name(f"{path.stem}-{n}{path.suffix}") for n in itertools.count(2))
    return next(candidate for candidate in candidates if not candidate.exists())


def iter_records(source, offset: int = 0, limit: int | None = None) -> Iterator[tuple[int, Any]]:
    """`(index, record)` pairs of `source[offset : offset + limit]`; `index` counts from the source's start.

    `source`: a JSON/JSONL file path, `"sharegpt"` (the shipped ShareGPT file, `eagle3_hf.assets.SHAREGPT`), a
    `datasets.Dataset`, or any iterable of dict records.
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"offset={offset} and limit={limit} must be non-negative.")
    if isinstance(source, (str, os.PathLike)):
        if str(source) == "sharegpt":
            from ..assets import SHAREGPT

            source = SHAREGPT.path()
        if not Path(source).is_file():
            raise FileNotFoundError(
                f"Data file {source} not found; pass a JSON/JSONL file, 'sharegpt', or a "
                "datasets.Dataset (e.g. from datasets.load_dataset)."
            )
        source = iter_json_records(source)
    stop = None if limit is None else offset + limit
    yield from itertools.islice(enumerate(source), offset, stop)


def normalize_messages(record: Any) -> list[dict[str, str]]:
    """A record's turns as `[{"role": "system"|"user"|"assistant", "content": str}, ...]`.

    Rules: roles are normalised with `ROLE_ALIASES`; turns with blank content are removed; consecutive turns of
    the same role are merged (contents joined by a blank line), so roles alternate; a system turn is kept only as
    the first message; turns before the first user turn (other than that system turn) are dropped. Trailing user
    turns are kept (regeneration answers them). Raises `ValueError` for a malformed record.
    """
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a dict, got {type(record).__name__}.")
    if "conversations" in record:
        turns, role_key, content_key = record["conversations"], "from", "value"
    elif "messages" in record:
        turns, role_key, content_key = record["messages"], "role", "content"
    else:
        raise ValueError(f"record has neither 'conversations' (ShareGPT) nor 'messages' (chat); keys: {list(record)}.")
    messages: list[dict[str, str]] = []
    for turn in turns or []:
        role = ROLE_ALIASES.get(str(turn.get(role_key)).lower()) if isinstance(turn, dict) else None
        content = _text_content(turn.get(content_key)) if isinstance(turn, dict) else None
        if role is None or not isinstance(content, str):
            raise ValueError(
                f"turn {turn!r:.80} needs '{role_key}' in {sorted(ROLE_ALIASES)} and a '{content_key}' that is a "
                "string or a list of text parts."
            )
        if not content.strip() or (role == "system" and messages):
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1] = {"role": role, "content": messages[-1]["content"] + "\n\n" + content}
        else:
            messages.append({"role": role, "content": content})
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system) :]
    while rest and rest[0]["role"] != "user":
        rest.pop(0)
    return system + rest if rest else []


def _text_content(content: Any) -> str | None:
    """A turn's text: a string as is; OpenAI-style content parts (`[{"type": "text", "text": ...}, ...]`) joined.

    Returns None for anything else. A part that is not text (an image, audio, ...) raises `ValueError` naming its
    type: the head is trained on text only, and dropping the part would change what the turn says.
    """
    if isinstance(content, str) or not isinstance(content, list):
        return content if isinstance(content, str) else None
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(f"content part {part!r:.80} is not text (type {kind!r}); only text parts are supported.")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"content part {part!r:.80} has no string 'text'.")
        texts.append(part["text"])
    return "".join(texts)


def first_user_turn(record: Any) -> str | None:
    """The content of a record's first user turn (after `normalize_messages`); None for a malformed record or one
    without a user turn."""
    try:
        messages = normalize_messages(record)
    except ValueError:
        return None
    return next((message["content"] for message in messages if message["role"] == "user"), None)


def training_messages(record: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """`normalize_messages` minus trailing non-assistant turns; `[]` when nothing is left to learn."""
    messages = normalize_messages(record)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    if not messages:
        return []
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def read_sharegpt_heldout_records(start: int, source="sharegpt") -> Iterator[tuple[int, dict[str, Any]]]:
    """The held-out slice `source[start:]` (train with `limit=start`): `(index, {"id", "messages",
    "first_user_turn"})` for each record with a user turn; malformed records are skipped."""
    for index, record in iter_records(source, offset=start):
        try:
            messages = normalize_messages(record)
        except ValueError:
            continue
        user_turns = [message["content"] for message in messages if message["role"] == "user"]
        if user_turns:
            yield index, {"id": record.get("id", index), "messages": messages, "first_user_turn": user_turns[0]}
