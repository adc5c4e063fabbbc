"""Counted nouns for messages: ``1 trial``, ``2 trials`` (never ``1 trials``)."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int | float, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural unless ``n`` is one.

    Args:
        n: the count.
        word: the singular (``trial``).
        many: the plural when it is not ``word + "s"`` (``budgets`` is the default rule).

    Example::

        plural(1, "step")  # "1 step"
        plural(3, "step")  # "3 steps"
    """
    return f"{n:g} {word if n == 1 else (many or word + 's')}"
