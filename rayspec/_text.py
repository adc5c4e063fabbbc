"""Text that must stay on one line: what a config value may hold, and how a label is printed.

A value of the experiment reaches a server's argv, its environment, ``best.sh`` and the
progress lines; a line break in it would end a comment of ``best.sh`` (the next line runs) or
split a progress line. :func:`unsafe_char` finds what :mod:`rayspec._config` refuses;
:func:`one_line` is the defence where text is written: whatever it holds stays one line.
"""

from __future__ import annotations

import shlex
import unicodedata

__all__ = ["one_line", "shell_quote", "unsafe_char"]

# Control characters (C0, DEL, C1: newline, CR, NUL, U+0085 ...), lone surrogates (bytes that
# were not UTF-8) and the Unicode line and paragraph separators U+2028 / U+2029.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def unsafe_char(text: str) -> str | None:
    """The first character of ``text`` that may not reach a command line or a script line."""
    for ch in text:
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            return ch
    return None


def one_line(text: str) -> str:
    """``text`` with every unsafe character written as its escape (``\\n``, ``\\x00``, ...)."""
    if unsafe_char(text) is None:
        return text
    return "".join(
        ascii(ch)[1:-1] if unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch for ch in text
    )


def shell_quote(arg: str) -> str:
    """``shlex.quote``, except that text with an unsafe character is written as bash's
    ``$'...'`` with escapes: the same argument, on one line of the script."""
    if unsafe_char(arg) is None:
        return shlex.quote(arg)
    out = []
    for ch in arg:
        if ch in "\\'":
            out.append("\\" + ch)
        elif unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"
