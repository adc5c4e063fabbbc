"""Prompt sets shipped with rayspec, and the deterministic choice of a request's inputs.

A benchmark must send the same requests to every candidate, so nothing here depends on the
clock, the process or Python's salted ``hash``: a request's prompt and length are a pure
function of ``(scenario, run, index)``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import random
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rayspec._exceptions import ConfigError
from rayspec._types import DEFAULT_CATEGORY

if TYPE_CHECKING:
    from rayspec.bench._plan import Scenario

_BUILTIN_DIR = pathlib.Path(__file__).parent / "prompts"


def builtin_prompt_sets() -> tuple[str, ...]:
    """Names of the prompt sets shipped in ``rayspec/bench/prompts/``."""
    return tuple(sorted(p.stem for p in _BUILTIN_DIR.glob("*.jsonl")))


_EXPECTED = (
    "expected records with a 'prompt' (or 'text') string, or ShareGPT 'conversations' "
    "(from: human) / OpenAI 'messages' (role: user) with a user turn"
)


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """One prompt of a set: its text, the category it is counted under, the output length
    the data gives it (``None``: the scenario's ``max_tokens``), and the line of the file it
    starts on (0: not from a file), for messages about it."""

    text: str
    category: str = DEFAULT_CATEGORY
    output_tokens: int | None = None
    line: int = dataclasses.field(default=0, compare=False)


def _turn_text(value: object) -> str | None:
    """A turn's text: a string, or the text parts of an OpenAI content list."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        text = "\n".join(p for p in parts if isinstance(p, str))
        return text or None
    return None


def _first_user_turn(turns: object, role_key: str, text_key: str) -> str | None:
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if isinstance(turn, dict) and turn.get(role_key) in ("human", "user"):
            # The first user turn is the prompt, even when empty (then the record is skipped):
            # a later turn answers the model and would not be the conversation's opening.
            return _turn_text(turn.get(text_key))
    return None


def _sendable(text: str, what: str, where: str) -> str:
    """``text`` as it can be sent (UTF-8); a lone surrogate (a JSON escape such as ``\\ud800``
    with no partner) cannot be encoded, and every request with it would fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{where}: {what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at "
            f"character {exc.start}), which no request can send as UTF-8; fix or drop the record"
        ) from None
    return text


def _record(obj: object, where: str) -> PromptRecord | None:
    """The record ``obj`` (``None``: a conversation without a usable user turn, skipped)."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: {_EXPECTED}")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category:
        raise ConfigError(f"{where}: 'category' must be a non-empty string, got {category!r}")
    _sendable(category, "'category'", where)
    output_tokens = obj.get("output_tokens")
    if output_tokens is not None and (
        isinstance(output_tokens, bool) or not isinstance(output_tokens, int) or output_tokens < 1
    ):
        raise ConfigError(
            f"{where}: 'output_tokens' must be an integer >= 1 (the request's output length in "
            f"tokens), got {output_tokens!r}"
        )
    if "conversations" in obj:
        text = _first_user_turn(obj["conversations"], "from", "value")
    elif "messages" in obj:
        text = _first_user_turn(obj["messages"], "role", "content")
    else:
        plain = obj.get("prompt", obj.get("text"))
        if not isinstance(plain, str) or not plain:
            raise ConfigError(f"{where}: {_EXPECTED}")
        text = plain
    if text is None:
        return None
    text = _sendable(text, "the prompt", where)
    line = int(where.rpartition(":")[2])  # where is FILE:LINE
    return PromptRecord(text=text, category=category, output_tokens=output_tokens, line=line)


# JSON's own whitespace (json.loads skips no other), and JSON Lines' line ends: \n, \r\n or \r,
# never the other characters str.splitlines takes for line breaks (U+2028, U+0085, \x0c...),
# which JSON strings may hold as they are.
_WS = re.compile(r"[ \t\n\r]*")
_LINE_END = re.compile(r"\r\n|\r|\n")


def _skip_ws(text: str, pos: int) -> int:
    found = _WS.match(text, pos)
    return found.end() if found is not None else pos


def _decoded(path: pathlib.Path) -> str:
    """The file's text: UTF-8, with or without a byte order mark."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); save the file as UTF-8"
        ) from None


def _json(text: str, pos: int, where: str, path: pathlib.Path | None = None) -> tuple[object, int]:
    """One JSON value at ``pos`` and where it ends; every way a value fails is one line, at
    ``where`` (with ``path``: a syntax error at its own line of ``text``)."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        at = where if path is None else f"{path}:{exc.lineno}"
        raise ConfigError(f"{at}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply for a JSON reader") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits
        raise ConfigError(f"{where}: not a usable JSON value ({exc})") from None


_DECODER = json.JSONDecoder()


def _records(path: pathlib.Path) -> Iterator[tuple[str, object]]:
    """The file's values with where each starts (``FILE:LINE``), in order: a JSON array's
    items, or one value per JSON Lines line (blank lines skipped)."""
    text = _decoded(path)
    start = _skip_ws(text, 0)
    if text.startswith("[", start):
        yield from _array_items(path, text, start + 1)
        return
    line = 1
    pos = 0
    for end in (*(m.start() for m in _LINE_END.finditer(text)), len(text)):
        body = text[pos:end]
        if body.strip(" \t"):
            obj, stop = _json(body, _skip_ws(body, 0), f"{path}:{line}")
            if body[stop:].strip(" \t"):
                raise ConfigError(f"{path}:{line}: not valid JSON (more after the record)")
            yield f"{path}:{line}", obj
        line += 1
        pos = end + (2 if text.startswith("\r\n", end) else 1)


def _array_items(path: pathlib.Path, text: str, pos: int) -> Iterator[tuple[str, object]]:
    """The items of the JSON array whose ``[`` ends at ``pos``, each with its line."""
    line, counted = 1, 0

    def where(at: int) -> str:
        nonlocal line, counted
        line += text.count("\n", counted, at)
        counted = at
        return f"{path}:{line}"

    pos = _skip_ws(text, pos)
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            here = where(pos)
            obj, pos = _json(text, pos, here, path)
            yield here, obj
            pos = _skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = _skip_ws(text, pos + 1)
                continue
            if not text.startswith("]", pos):
                raise ConfigError(f"{where(pos)}: not valid JSON (expected ',' or ']')")
            pos += 1
            break
    if text[pos:].strip(" \t\n\r"):
        raise ConfigError(f"{where(_skip_ws(text, pos))}: not valid JSON (more after the array)")


@functools.lru_cache(maxsize=16)
def load_dataset(name_or_path: str) -> tuple[PromptRecord, ...]:
    """Load a prompt set with each record's category.

    Args:
        name_or_path: a built-in name (``"default"``: 64 varied long-answer prompts;
            ``"mixed"``: 48 prompts, 12 each of ``code``, ``math``, ``chat``, ``long-form``) or
            the path of a file: JSON Lines or a JSON array of records, each either
            ``{"prompt": ...}`` (or ``"text"``), ShareGPT ``{"conversations": [{"from":
            "human", "value": ...}, ...]}`` or OpenAI ``{"messages": [{"role": "user",
            "content": ...}, ...]}``, with an optional ``"category"`` string (``"default"``
            when absent) and an optional ``"output_tokens"`` integer (the request's output
            length, as the data has it: e.g. the answer turn's length in the served model's
            tokenizer). A conversation's prompt is its first human / user turn; a
            conversation without one is skipped.

    Returns:
        The records, in file order.

    Raises:
        ConfigError: the name is unknown, the file is missing, a record is malformed or no
            record has a prompt.

    Example:
        >>> sorted({r.category for r in load_dataset("mixed")})
        ['chat', 'code', 'long-form', 'math']
    """
    path = _BUILTIN_DIR / f"{name_or_path}.jsonl"
    if not path.is_file():
        path = pathlib.Path(name_or_path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"prompt set {name_or_path!r}: neither a built-in set "
            f"({', '.join(builtin_prompt_sets())}) nor an existing JSON / JSONL file"
        )
    records: list[PromptRecord] = []
    seen = 0
    for where, obj in _records(path):  # checked as read: the first bad record is the one named
        seen += 1
        record = _record(obj, where)
        if record is not None:
            records.append(record)
    if not seen:
        raise ConfigError(f"{path}: the prompt set is empty")
    if not records:
        raise ConfigError(f"{path}: no record has a user turn; {_EXPECTED}")
    return tuple(records)


@functools.lru_cache(maxsize=16)
def load_prompts(name_or_path: str) -> tuple[str, ...]:
    """Load a prompt set's texts (see :func:`load_dataset` for the names and formats).

    Returns:
        The prompts, in file order.

    Raises:
        ConfigError: as :func:`load_dataset`.

    Example:
        >>> len(load_prompts("default"))
        64
    """
    return tuple(r.text for r in load_dataset(name_or_path))


def dataset_categories(name_or_path: str) -> tuple[str, ...]:
    """The distinct categories of a prompt set, sorted (``("default",)`` without categories).

    Example:
        >>> dataset_categories("mixed")
        ('chat', 'code', 'long-form', 'math')
    """
    return tuple(sorted({r.category for r in load_dataset(name_or_path)}))


@dataclasses.dataclass(frozen=True)
class RequestInput:
    """What one request sends, and the category its prompt is counted under."""

    prompt: str
    max_tokens: int
    category: str = DEFAULT_CATEGORY


def _rng(scenario: Scenario, *parts: object) -> random.Random:
    key = "\x1f".join(str(p) for p in (scenario.name, scenario.seed, *parts))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def request_input(scenario: Scenario, run: int, index: int) -> RequestInput:
    """The prompt, length and category of request ``index`` of run ``run`` (``-1`` = warm-up).

    The output length is the scenario's ``output_len_range`` draw when it has one, else the
    record's ``output_tokens`` when it has one, else the scenario's ``max_tokens``.

    Measured requests walk through the prompt set from a per-scenario offset (run ``r``, index
    ``i`` takes position ``offset + r * requests_per_run + i``), so one run never repeats a
    prompt while the set is large enough; warm-up requests walk backwards from the offset, so
    they avoid the first measured prompts.

    Example:
        >>> from rayspec.bench import Scenario
        >>> s = Scenario(name="c1")
        >>> request_input(s, 0, 0) == request_input(s, 0, 0)
        True
    """
    prompts = load_prompts(scenario.prompt_set)
    offset = _rng(scenario, "offset").randrange(len(prompts))
    seq = run * scenario.requests_per_run + index if run >= 0 else -(index + 1)
    pos = (offset + seq) % len(prompts)
    prompt = prompts[pos]
    # A prompt lengthened to input_len_range keeps the category (and the output length) of the
    # prompt it starts with.
    record = load_dataset(scenario.prompt_set)[pos]
    category = record.category
    rng = _rng(scenario, "lengths", run, index)
    # The data's own output length where the record has one; a scenario's range overrides it.
    max_tokens = scenario.max_tokens if record.output_tokens is None else record.output_tokens
    if scenario.output_len_range is not None:
        max_tokens = rng.randint(*scenario.output_len_range)
    if scenario.input_len_range is not None:
        target = rng.randint(*scenario.input_len_range)
        words = prompt.split()
        nxt = pos
        while len(words) < target:
            nxt = (nxt + 1) % len(prompts)
            words.extend(prompts[nxt].split())
        prompt = " ".join(words[:target])
    return RequestInput(prompt=prompt, max_tokens=max_tokens, category=category)
