"""Property: any twin profile file loads, or is refused with one line (``ProfileError``): naming
the key for a value or a key that is wrong, the file for a file that is no profile. Never another
exception, never a traceback of the YAML reader, never unbounded memory.

Generated from the shipped profiles: a key anywhere in the tree deleted, renamed, or given a
hostile value (NaN, infinities, huge and negative numbers, wrong types, control characters,
a huge string or list, nested garbage, an alias bomb); and files that are no profile (not UTF-8,
binary, truncated, empty, too large, deeply nested, a billion laughs, a Python tag). Seeded and
bounded as the experiment fuzz (``RAYSPEC_FUZZ_SEED``, ``RAYSPEC_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import math
import os
import resource
import tempfile
from importlib import resources
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from rayspec.twin import Profile
from rayspec.twin import ProfileError
from rayspec.twin import available_profiles
from rayspec.twin import load_profile
from rayspec.twin._profile_text import PROFILE_MAX_BYTES
from tests.fuzz_tests.test_config_fuzz import COUNTS
from tests.fuzz_tests.test_config_fuzz import FUZZ
from tests.fuzz_tests.test_config_fuzz import seeded


def _shipped(name: str) -> dict[str, Any]:
    ref = resources.files("rayspec.twin").joinpath("profiles", f"{name}.yaml")
    data: dict[str, Any] = yaml.safe_load(ref.read_text(encoding="utf-8"))
    return data


SHIPPED = {name: _shipped(name) for name in available_profiles()}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of the tree (mappings and list items)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


HOSTILE = st.one_of(
    st.sampled_from([
        math.nan, math.inf, -math.inf, 1e308, -1e308, 10**400, -(10**30), -1, 0, 0.0, -0.0,
        True, False, None, "", " ", "x\ny", "nul\x00", "\x1b[2J", "\u2028", "1e3", "NaN",
        [], {}, [1, 2], {"a": 1}, [[[]]], "k" * 5000, list(range(2000)),
    ]),
    st.text(max_size=30),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                    max_size=3),
        max_leaves=8,
    ),
)  # fmt: skip


@st.composite
def tree_mutation(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    """(how, the profile as data, the dotted key the mutation touched)."""
    name = draw(st.sampled_from(sorted(SHIPPED)))
    data = yaml.safe_load(yaml.safe_dump(SHIPPED[name]))  # a deep copy
    paths = _paths(data)
    n = draw(st.integers(1, 3))
    touched = ""
    how = ""
    for _ in range(n):
        path = draw(st.sampled_from(paths))
        parent: Any = data
        try:
            for part in path[:-1]:
                parent = parent[part]
            last = path[-1]
            parent[last]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation changed this branch
        how = draw(st.sampled_from(["delete", "value", "value", "rename", "add"]))
        touched = ".".join(str(p) for p in path if isinstance(p, str))
        if how == "delete" and isinstance(parent, dict):
            del parent[last]
        elif how == "rename" and isinstance(parent, dict):
            parent[f"{last}_typo"] = parent.pop(last)
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["unknown_key", "x\ny", "", "__proto__"]))] = 1
        else:
            parent[last] = draw(HOSTILE)
    return how, data, touched


BOMB = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@st.composite
def bad_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """(how, the file's bytes) for files that are no profile."""
    text = yaml.safe_dump(SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))]).encode()
    how = draw(st.sampled_from([
        "truncated", "not_utf8", "binary", "empty", "too_large", "deep", "bomb", "python_tag",
        "recursive", "scalar", "duplicate_keys", "bomb_in_key",
    ]))  # fmt: skip
    if how == "truncated":
        return how, text[: draw(st.integers(0, len(text) - 1))]
    if how == "not_utf8":
        cut = draw(st.integers(0, len(text)))
        return how, text[:cut] + b"\xff\xfe\x80" + text[cut:]
    if how == "binary":
        return how, draw(st.binary(min_size=1, max_size=200))
    if how == "empty":
        return how, b""
    if how == "too_large":
        return how, text + b"# " + b"x" * (PROFILE_MAX_BYTES + 1) + b"\n"
    if how == "deep":
        depth = draw(st.sampled_from([1_000, 50_000, 300_000]))
        return how, b"profile: " + b"[" * depth + b"]" * depth + b"\n"
    if how == "bomb":
        return how, ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB + "profile: *i\n").encode()
    if how == "bomb_in_key":
        return how, ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB + "forward: {C0_ms: *i}\n"
                     ).encode() + text  # fmt: skip
    if how == "python_tag":
        return how, b"profile: !!python/object/apply:os.system ['echo PWNED']\n" + text
    if how == "recursive":
        return how, b"profile: &r [*r]\n"
    if how == "scalar":
        return how, draw(st.sampled_from([b"42\n", b"- a\n- b\n", b"null\n", b"'text'\n"]))
    return how, text + text.split(b"\n", 1)[0] + b"\n"  # the first key again


def _load(blob: bytes) -> tuple[Profile | None, str]:
    with tempfile.NamedTemporaryFile("wb", suffix=".yaml", delete=False) as fh:
        fh.write(blob)
    try:
        return load_profile(fh.name), ""
    except ProfileError as exc:
        return None, str(exc)
    finally:
        os.unlink(fh.name)


def _one_line(message: str) -> None:
    assert message and "\n" not in message and "\r" not in message, repr(message[:300])
    assert len(message) < 1000, message[:300]


@FUZZ
@seeded
@given(tree_mutation())
def test_a_mutated_profile_loads_or_names_the_key(case: tuple[str, dict[str, Any], str]) -> None:
    how, data, touched = case
    blob = yaml.safe_dump(data, allow_unicode=True).encode()
    profile, message = _load(blob)
    if profile is not None:
        COUNTS["twin profile loaded"] += 1
        return
    _one_line(message)
    assert "key '" in message, message  # a value or a key of the tree: it is named
    COUNTS[f"twin profile refused ({how})"] += 1


@FUZZ
@seeded
@given(bad_file())
def test_a_file_that_is_no_profile_is_refused_in_one_line(case: tuple[str, bytes]) -> None:
    how, blob = case
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    profile, message = _load(blob)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"{how}: peak memory grew {grown_mb:.0f} MB"
    if profile is not None:  # a truncation at a line break may still be a whole profile
        assert how in ("truncated", "duplicate_keys"), how
        COUNTS["twin profile file loaded"] += 1
        return
    _one_line(message)
    assert "profile file '" in message, message
    COUNTS[f"twin profile file refused ({how})"] += 1


def test_an_alias_bomb_as_the_study_profile_is_one_error_line(tmp_path) -> None:
    """Before: a MemoryError traceback (the error message's repr of 10^9 values)."""
    import subprocess
    import sys

    from tests.helpers import REPO
    from tests.helpers import TWIN_EXPERIMENT

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB + "profile: *i\n")
    done = subprocess.run(
        [sys.executable, "-m", "rayspec.tune", "--dry-run", TWIN_EXPERIMENT,
         f"server.twin.profile={bomb}", f"output.dir={tmp_path / 'runs'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: server.twin.profile: ") and "aliases expand to" in line
