"""The experiment schema as data for the fuzz suite: every key, its type, and hostile values.

Keys come from :class:`rayspec._config.ExperimentConfig` itself (so a new key is fuzzed without
a line here). Values are drawn per type, biased towards what breaks checks: NaN and infinities,
huge and negative numbers, NUL and other control characters, Unicode line separators, paths,
URLs, ports, wrong types and nested garbage.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any

from hypothesis import strategies as st

from rayspec._config import ExperimentConfig

SECTIONS = tuple(f.name for f in dataclasses.fields(ExperimentConfig))


def _leaf_keys(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(kind):
            out += _leaf_keys(kind, f"{key}.")  # type: ignore[arg-type]
        else:
            out.append((key, kind))
    return out


# Every settable key of the schema with its declared type (dotted: ``server.twin.fault``).
KEYS: list[tuple[str, Any]] = _leaf_keys(ExperimentConfig)


def _base(kind: Any) -> Any:
    """``int | None`` -> int; a list/dict type stays as it is."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if args else str
    return kind


CONTROL = "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x85\x9b\u2028\u2029"
NASTY_TEXT = [
    "",
    " ",
    "x\ntouch PWNED\n#",
    "a\rb",
    "nul\x00byte",
    "\x1b[2J",
    "tab\there",
    "del\x7f",
    "nel\x85",
    "ls\u2028x",
    "ps\u2029x",
    "$(touch PWNED)",
    "`id`",
    "'; rm -rf ~ #",
    "--host",
    "--hos=0.0.0.0",
    "--enable-nccl-nv",
    "-1",
    "~",
    "/",
    "/proc/self/x",
    "../../etc/passwd",
    "C:\\x",
    "sqlite://",
    "sqlite:////nonexistent/dir/x.db",
    "foo://bar",
    "ray://127.0.0.1:1",
    "http://127.0.0.1:1",
    "auto",
    "127.0.0.1:0",
    "[::1]:99999",
    "héllo",
    "日本語",
    "🙂",
    "\ud800",
    "a" * 300,
    "NaN",
    "inf",
    "null",
    "~/x",
    "on",
    "off",
    "yes",
    "unset",
    "${oc.env:HOME}",
    "${server.port}",
    "???",
]
NASTY_NUMBERS = [
    0,
    -1,
    1,
    2,
    7,
    65535,
    65536,
    70000,
    2**31,
    2**32,
    2**32 - 1,
    2**63,
    -(2**63),
    10**30,
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    1e-300,
    1e300,
    0.5,
    1.5,
]


def text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NASTY_TEXT),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
        st.text(alphabet=st.sampled_from(CONTROL + "ab-=/:."), max_size=8),
    )


def scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        text(),
        st.sampled_from(NASTY_NUMBERS),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
    )


def garbage() -> st.SearchStrategy[Any]:
    """Nested lists and mappings of anything."""
    return st.recursive(
        scalar(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(
                st.one_of(text(), st.sampled_from(["NCCL_PROTO", "--x"])), inner, max_size=3
            ),
        ),  # fmt: skip
        max_leaves=6,
    )


def value_for(kind: Any) -> st.SearchStrategy[Any]:
    """Mostly values of the key's own type (hostile ones), sometimes anything at all."""
    base = _base(kind)
    origin = typing.get_origin(base)
    if base is bool:
        own: st.SearchStrategy[Any] = st.one_of(st.booleans(), text())
    elif base is int:
        own = st.one_of(st.sampled_from(NASTY_NUMBERS), st.integers(-(2**70), 2**70))
    elif base is float:
        own = st.one_of(st.sampled_from(NASTY_NUMBERS), st.floats())
    elif origin is list:
        own = st.lists(st.one_of(text(), st.sampled_from(NASTY_NUMBERS), garbage()), max_size=4)
    elif origin is dict:
        own = st.dictionaries(
            st.one_of(
                text(),
                st.sampled_from(
                    [
                        "NCCL_PROTO",
                        "NCCL_ALGO",
                        "NCCL_PROTOCOL",
                        "--tokenizer-path",
                        "--hos",
                        "nccl.NCCL_PROTO",
                        "spec.mode",
                        "flags.--x",
                        "A\nB",
                    ]
                ),
            ),  # fmt: skip
            st.one_of(st.lists(text(), max_size=3), text(), garbage()),
            max_size=3,
        )
    else:  # str and enums
        own = text()
    return st.one_of(own, own, plausible(kind), garbage())


def plausible(kind: Any) -> st.SearchStrategy[Any]:
    """Values a user might mean (so valid configurations are generated too)."""
    base = _base(kind)
    if base is bool:
        return st.booleans()
    if base is int:
        return st.integers(0, 64)
    if base is float:
        return st.floats(0.001, 100.0)
    words = st.sampled_from(["", "x", "default", "EAGLE3", "off", "on", "1", "LL", "Simple"])
    if typing.get_origin(base) is list:
        return st.lists(st.one_of(st.integers(1, 8), words), max_size=3)
    if typing.get_origin(base) is dict:
        return st.dictionaries(
            st.sampled_from(["NCCL_PROTO", "NCCL_ALGO", "--disable-custom-all-reduce"]),
            st.lists(words, min_size=1, max_size=2),
            max_size=2,
        )
    return words


def override_text(key: str, value: Any) -> str:
    """``key=value`` as a user types it: JSON is YAML's flow style, escapes included."""
    if isinstance(value, str):
        return f"{key}={value}"  # raw, as from a shell
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={'.nan' if math.isnan(value) else ('-' if value < 0 else '') + '.inf'}"
    try:
        return f"{key}={json.dumps(value)}"
    except (TypeError, ValueError):
        return f"{key}={value!r}"
