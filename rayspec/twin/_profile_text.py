"""A profile file's text, bounded like an experiment file's before anything is built.

A profile given by path (``server.twin.profile``, ``--twin-profile``) is a user's file: read at
most :data:`PROFILE_MAX_BYTES`, as UTF-8, and refused when its aliases expand past
:data:`rayspec._yaml.YAML_MAX_NODES` (an alias bomb was a ``MemoryError`` traceback: the error
message's ``repr`` of the expanded value). Every refusal is one :class:`ProfileError` line;
:func:`show` bounds a value quoted in one.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

from rayspec._text import one_line
from rayspec._yaml import YAML_MAX_NODES
from rayspec._yaml import expanded_nodes
from rayspec.twin._errors import ProfileError

__all__ = ["PROFILE_MAX_BYTES", "parse_yaml", "read_profile_file", "show"]

PROFILE_MAX_BYTES = 1 << 20
"""A profile file is refused past this size (the built-in ones are 5-8 KB)."""

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # same semantics, C speed
_REPR = reprlib.Repr()  # attributes, not keywords: Python 3.11 takes none
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 2, 4, 4
_REPR.maxstring = _REPR.maxother = 60


def show(value: Any) -> str:
    """``repr(value)``, bounded however large ``value`` is (never built in full), one line."""
    return one_line(_REPR.repr(value))


def read_profile_file(path: str) -> str:
    """The text of the profile file ``path``.

    Raises:
        ProfileError: it cannot be read, is larger than :data:`PROFILE_MAX_BYTES` or is not
            UTF-8.
    """
    shown = show(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(PROFILE_MAX_BYTES + 1)  # never more: a profile is a few KB
    except OSError as exc:
        raise ProfileError(f"cannot read profile {shown}: {exc.strerror or exc}") from exc
    if len(raw) > PROFILE_MAX_BYTES:
        raise ProfileError(
            f"profile file {shown} is larger than {PROFILE_MAX_BYTES:,} bytes (a profile is a "
            "few KB): not a profile"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"profile file {shown} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
            f"{exc.start})"
        ) from None


def parse_yaml(text: str, source: str) -> Any:
    """``text`` as data, its alias expansion counted before it is built.

    Raises:
        ProfileError: not YAML, an alias bomb, a recursive alias, or nested too deeply.
    """
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        nodes = expanded_nodes(node)  # on the node graph: nothing is expanded
        if nodes > YAML_MAX_NODES:
            raise ProfileError(
                f"{source}: its aliases expand to {nodes:,} values (at most "
                f"{YAML_MAX_NODES:,}); write the values out or use fewer aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        first = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ProfileError(f"{source} is not valid YAML{at}: {first}") from None
    except ProfileError:
        raise
    except ValueError as exc:  # expanded_nodes: an alias inside the node it names
        raise ProfileError(f"{source} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ProfileError(f"{source} is not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
