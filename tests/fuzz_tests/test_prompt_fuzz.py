"""Property: any prompt file (``bench.prompts``) loads to exactly the records it holds, or is
refused with one ``ConfigError`` line naming the file and the line of its first bad record
(``FILE:LINE: ...``; a file with no record, or none with a user turn, is named alone:
``FILE: ...``); no other exception, no traceback (issue 33, item 8 and the deep-JSON low item).

Generated: JSON Lines and JSON arrays (compact or indented) of plain ``prompt``/``text``
records, ShareGPT ``conversations`` and OpenAI ``messages`` (string or content-part turns),
with or without a user turn; categories and output lengths, good and bad; text over the whole
of Unicode with the characters that break readers (lone surrogates as JSON escapes, U+2028,
U+0085, NUL, BOM), written escaped or raw; blank lines and CRLF; nesting up to 100,000 deep;
integers past Python's 4,300-digit limit; long texts and many records; the file as UTF-8,
UTF-8 with a BOM, UTF-16, or with an invalid byte in a record. The generator knows what each
record is, so the property checks the outcome itself: the texts, categories and output lengths
loaded, or the line refused. A few cases go through the CLI (preflight): exit 2, one
``error: bench.prompts: FILE:LINE: ...`` line.

Seeded as the config fuzz is (``RAYSPEC_FUZZ_SEED``, ``RAYSPEC_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec._exceptions import ConfigError
from rayspec.bench import load_dataset
from tests.fuzz_tests.test_config_fuzz import EXAMPLES
from tests.fuzz_tests.test_config_fuzz import SEED
from tests.fuzz_tests.test_config_fuzz import seeded

PROMPT_FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=SEED is None,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Outcomes, for the closing counts (conftest.py prints them).
PROMPT_COUNTS: Counter[str] = Counter()

# Characters that break line-based or strict readers, as text may hold them.
_TRICKY = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\r", "\n", "\t", "\x00",
           "\ufeff", "é", "漢", "😀", "\U0010ffff", '"', "\\", "|"]  # fmt: skip
_SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)


@dataclass
class Rec:
    """One generated record: its JSON value, and what loading must make of it."""

    value: Any
    ok: bool = True  # False: the file must be refused at this record's line
    text: str | None = None  # the prompt it yields (None: a conversation skipped, no user turn)
    category: str = "default"
    output_tokens: int | None = None


def _texts(surrogate: bool = False) -> st.SearchStrategy[str]:
    plain = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
    mixed = st.lists(st.one_of(plain, st.sampled_from(_TRICKY)), min_size=1, max_size=6).map(
        "".join
    )
    base = st.one_of(plain, mixed, st.integers(1000, 200_000).map(lambda n: "w " * n))
    if not surrogate:
        return base
    return st.tuples(base, _SURROGATES, base).map("".join)


@st.composite
def records(draw: st.DrawFn) -> Rec:
    kind = draw(st.sampled_from([
        "plain", "plain", "sharegpt", "openai", "openai-parts", "skipped", "not-a-dict",
        "bad-prompt", "bad-category", "bad-output", "surrogate", "surrogate-category",
        "surrogate-ignored", "deep-ignored", "deep", "huge-int",
    ]))  # fmt: skip
    text = draw(_texts())
    extra: dict[str, Any] = {}
    category, output = "default", None
    if draw(st.booleans()):
        category = draw(st.one_of(st.sampled_from(["code", "math", "long-form"]), _texts()))
        extra["category"] = category
    if draw(st.booleans()):
        output = draw(st.integers(1, 4096))
        extra["output_tokens"] = output
    if kind == "plain":
        key = draw(st.sampled_from(["prompt", "text"]))
        return Rec({key: text, **extra}, text=text, category=category, output_tokens=output)
    if kind == "sharegpt":
        turns = [{"from": "system", "value": "be brief"}] if draw(st.booleans()) else []
        turns += [{"from": "human", "value": text}, {"from": "gpt", "value": "answer"}]
        return Rec({"conversations": turns, **extra}, text=text, category=category,
                   output_tokens=output)  # fmt: skip
    if kind in ("openai", "openai-parts"):
        content: Any = text if kind == "openai" else [{"type": "text", "text": text}]
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": "a"}]
        return Rec({"messages": msgs, **extra}, text=text, category=category,
                   output_tokens=output)  # fmt: skip
    if kind == "skipped":  # a conversation without a user turn: loaded as nothing
        turns = [{"from": "gpt", "value": text}]
        return Rec({"conversations": turns, **extra}, text=None, category=category)
    if kind == "not-a-dict":
        return Rec(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(),
                                  st.none(), st.just(text))), ok=False)  # fmt: skip
    if kind == "bad-prompt":
        bad = draw(st.one_of(st.just(""), st.integers(), st.none(), st.lists(st.text())))
        return Rec({"prompt": bad}, ok=False)
    if kind == "bad-category":
        bad = draw(st.one_of(st.just(""), st.integers(), st.none(), st.lists(st.text())))
        return Rec({"prompt": text, "category": bad}, ok=False)
    if kind == "bad-output":
        bad = draw(st.one_of(st.integers(max_value=0), st.booleans(), st.floats(),
                             st.text(max_size=5)))  # fmt: skip
        return Rec({"prompt": text, "output_tokens": bad}, ok=False)
    if kind == "surrogate":  # in the prompt sent: it cannot be encoded for the request
        where = draw(st.sampled_from(["prompt", "sharegpt", "openai"]))
        bad = draw(_texts(surrogate=True))
        value: Any = {"prompt": bad}
        if where == "sharegpt":
            value = {"conversations": [{"from": "human", "value": bad}]}
        elif where == "openai":
            value = {"messages": [{"role": "user", "content": bad}]}
        return Rec(value, ok=False)
    if kind == "surrogate-category":
        return Rec({"prompt": text, "category": draw(_texts(surrogate=True))}, ok=False)
    if kind == "surrogate-ignored":  # in a turn that is never sent: harmless
        turns = [{"from": "human", "value": text}, {"from": "gpt", "value": "\ud800"}]
        return Rec({"conversations": turns, **extra}, text=text, category=category,
                   output_tokens=output)  # fmt: skip
    depth = draw(st.sampled_from([3, 40, 100_000])) if kind.startswith("deep") else 0
    if kind == "deep-ignored" and depth < 1000:  # shallow nesting in a key nobody reads
        nested: Any = "x"
        for _ in range(depth):
            nested = [nested]
        return Rec({"prompt": text, "meta": nested, **extra}, text=text, category=category,
                   output_tokens=output)  # fmt: skip
    if kind.startswith("deep"):  # past what a JSON reader recurses into: refused
        return Rec(_Raw("[" * 100_000 + "]" * 100_000), ok=False)
    return Rec(_Raw('{"prompt": "x", "output_tokens": 1' + "0" * 5000 + "}"), ok=False)


@dataclass(frozen=True)
class _Raw:
    """A record written as this JSON text (what json.dumps cannot make)."""

    json: str


@dataclass
class File:
    records: list[Rec]
    array: bool
    indent: int | None
    ascii: bool  # escape every non-ASCII character (else U+2028 and friends are raw)
    encoding: str  # utf-8, utf-8-sig, utf-16, or bad-byte (an invalid byte in one record)
    bad_byte_at: int  # the record given the invalid byte (bad-byte only)
    blank_lines: bool
    crlf: bool


@st.composite
def files(draw: st.DrawFn) -> File:
    recs = draw(st.lists(records(), min_size=0, max_size=12))
    clean = draw(st.booleans())  # half the files hold only good records, in good encodings
    if clean:
        recs = [r for r in recs if r.ok]
    codecs = (
        ["utf-8", "utf-8-sig"] if clean else ["utf-8"] * 3 + ["utf-8-sig", "utf-16", "bad-byte"]
    )
    return File(
        records=recs,
        array=draw(st.booleans()),
        indent=draw(st.sampled_from([None, None, 2])),
        ascii=draw(st.booleans()),
        encoding=draw(st.sampled_from(codecs)),
        bad_byte_at=draw(st.integers(0, max(0, len(recs) - 1))),
        blank_lines=draw(st.booleans()),
        crlf=draw(st.booleans()),
    )


def _dump(rec: Rec, f: File) -> str:
    if isinstance(rec.value, _Raw):
        return rec.value.json
    return json.dumps(rec.value, ensure_ascii=f.ascii, indent=f.indent if f.array else None)


def render(f: File) -> tuple[bytes, list[tuple[int, int]]]:
    """The file's bytes and the lines (1-based) each record starts and ends on."""
    nl = "\r\n" if f.crlf else "\n"
    parts: list[str] = []
    starts: list[tuple[int, int]] = []
    line = 1
    if f.array:
        parts.append("[" + nl)
        line += 1
    for i, rec in enumerate(f.records):
        if f.blank_lines:
            parts.append(nl)
            line += 1
        body = _dump(rec, f).replace("\n", nl)
        starts.append((line, line + body.count("\n")))
        sep = "," if f.array and i < len(f.records) - 1 else ""
        parts.append(body + sep + nl)
        line += body.count("\n") + 1
    if f.array:
        parts.append("]" + nl)
    text = "".join(parts)
    if f.encoding == "bad-byte" and f.records:
        # The invalid byte goes just after the chosen record's first character.
        offset = sum(len(p) for p in parts[: _part_index(f, f.bad_byte_at)]) + 1
        head = text[:offset].encode("utf-8", "surrogatepass")
        return head + b"\xff" + text[offset:].encode("utf-8", "surrogatepass"), starts
    codec = "utf-8" if f.encoding == "bad-byte" else f.encoding
    return text.encode(codec, "surrogatepass"), starts


def _part_index(f: File, record: int) -> int:
    return (
        (1 if f.array else 0) + record * (2 if f.blank_lines else 1) + (1 if f.blank_lines else 0)
    )


def _raw_surrogate(rec: Rec, f: File) -> bool:
    """The record's JSON holds a surrogate itself (written unescaped): not UTF-8."""
    return any(0xD800 <= ord(c) <= 0xDFFF for c in _dump(rec, f))


def expected(
    f: File, spans: list[tuple[int, int]]
) -> tuple[str, int | None, int | None] | list[Rec]:
    """What loading must give: the records, or ("refused", first, last): refused at a line
    from first to last (None: the file itself, no line).

    The file is decoded first: bytes that are not UTF-8 are its first problem (a line of the
    record holding the first bad byte); then the records in file order, the first bad one
    refused at the line it starts on."""
    if f.encoding == "utf-16":
        return ("refused", 1, 1)
    undecodable = [i for i, r in enumerate(f.records) if _raw_surrogate(r, f)]
    if f.encoding == "bad-byte" and f.records:
        undecodable.append(f.bad_byte_at)
    if undecodable:
        return ("refused", *spans[min(undecodable)])
    bad = [i for i, r in enumerate(f.records) if not r.ok]
    if bad:
        first = spans[bad[0]][0]
        return ("refused", first, first)
    loaded = [r for r in f.records if r.text is not None]
    if not loaded:
        return ("refused", None, None)
    return loaded


@seeded
@PROMPT_FUZZ
@given(files())
def test_a_prompt_file_loads_exactly_or_is_refused_at_its_line(f: File) -> None:
    # A file that opens with "[" is a JSON array: JSON Lines opening with an empty list is one.
    assume(f.array or not f.records or _dump(f.records[0], f) != "[]")
    data, starts = render(f)
    want = expected(f, starts)
    with tempfile.TemporaryDirectory(prefix="rayspec-prompts-") as tmp:
        path = os.path.join(tmp, "data.json" if f.array else "data.jsonl")
        with open(path, "wb") as fh:
            fh.write(data)
        load_dataset.cache_clear()
        try:
            got = load_dataset(path)
        except ConfigError as exc:
            message = str(exc)
            assert "\n" not in message, message
            assert isinstance(want, tuple), f"a good file was refused: {message}"
            _, first, last = want
            said = re.match(rf"{re.escape(path)}(?::(\d+))?: ", message)
            assert said is not None, f"names no file: {message[:300]!r}"
            line = int(said[1]) if said[1] else None
            if first is None:
                assert line is None, f"the file is refused, not line {line}: {message[:300]!r}"
            else:
                assert line is not None and first <= line <= (last or first), (
                    f"expected line {first}-{last}: {message[:300]!r}"
                )
            PROMPT_COUNTS["refused at its line" if line else "refused (the file)"] += 1
            return
        finally:
            load_dataset.cache_clear()
    assert not isinstance(want, tuple), f"loaded, but must be refused at line {want[1]}"
    assert [(r.text, r.category, r.output_tokens) for r in got] == [
        (r.text, r.category, r.output_tokens) for r in want
    ]
    for r in got:
        r.text.encode("utf-8")  # every prompt can be sent
    PROMPT_COUNTS["loaded"] += 1


@settings(max_examples=max(5, EXAMPLES // 15), derandomize=SEED is None, database=None,
          deadline=None, suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(files())
def test_the_cli_refuses_a_bad_prompt_file_in_one_line(tmp_path_factory: Any, f: File) -> None:
    """Through preflight (what would start Ray replaced by a marker): exit 2 and one line."""
    import ray

    import rayspec.tune.__main__ as cli
    from tests.test_bad_input_preflight import experiment
    from tests.test_bad_input_preflight import port

    data, starts = render(f)
    want = expected(f, starts)
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "data.jsonl"
    path.write_bytes(data)
    err = io.StringIO()
    load_dataset.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_run", lambda *_a: 0)
        mp.setattr(ray, "init", _no_ray)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main([experiment(folder), f"bench.prompts={path}", port()])
    load_dataset.cache_clear()
    if not isinstance(want, tuple):
        assert rc == 0, err.getvalue()
        PROMPT_COUNTS["accepted by the CLI"] += 1
        return
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err.getvalue()
    assert re.match(rf"error: bench\.prompts: {re.escape(str(path))}(:\d+)?: ", lines[0]), lines
    PROMPT_COUNTS["refused by the CLI"] += 1


def _no_ray(*_a: object, **_k: object) -> None:
    raise AssertionError("ray.init was called at the preflight boundary")
