"""Text from the data (a prompt category, a failure's message) as one Markdown table cell.

Such text is whatever a prompt file or a server log held: a line break would end the table row
(the rest of the row lost), a ``|`` would split the cell, raw HTML would be rendered by a
Markdown viewer. :func:`md_cell` writes it as text: control characters as their escapes, ``|``
escaped, ``<``, ``>`` and ``&`` as HTML entities, cut at a length.
"""

from __future__ import annotations

from rayspec._text import one_line

__all__ = ["md_cell"]

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|"})


def md_cell(text: str, limit: int | None = None) -> str:
    """``text`` as the content of one Markdown table cell, at most ``limit`` characters of it
    (then ``…`` and how long it was).

    Example:
        >>> md_cell("a|b\\n<i>c</i>")
        'a\\\\|b\\\\n&lt;i&gt;c&lt;/i&gt;'
        >>> md_cell("x" * 100, 10)
        'xxxxxxxxxx… (100 characters)'
    """
    flat = one_line(text)
    cut = ""
    if limit is not None and len(flat) > limit:
        flat, cut = flat[:limit], f"… ({len(flat)} characters)"
    return flat.translate(_ENTITIES) + cut
