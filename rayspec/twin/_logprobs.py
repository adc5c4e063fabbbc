"""The twin's log-probabilities: deterministic numbers in SGLang's shapes.

The twin has no logits. A token's log-probability is a fixed function of its id, and the greedy
token is always the most likely (the others of a ``top_logprobs`` list are below it), which is
what a client of greedy decoding can rely on. The values mean nothing beyond that.
"""

from __future__ import annotations

from typing import Any

from rayspec.twin._text import SPECIAL_TEXT
from rayspec.twin._text import TOKEN_ID_OFFSET
from rayspec.twin._text import WORDS
from rayspec.twin._text import word

_STEP = 0.25  # each runner-up of a top list is this much less likely than the one before


def logprob(token_id: int) -> float:
    """The (made up, stable) log-probability of ``token_id`` where it was picked."""
    return -(0.5 + (token_id * 2654435761 % 1000) / 1000.0)


def top(token_id: int, k: int) -> list[tuple[float, int]]:
    """The ``k`` likeliest tokens where ``token_id`` was picked, likeliest first."""
    chosen = logprob(token_id)
    out = [(chosen, token_id)]
    for j in range(1, max(0, k)):
        other = TOKEN_ID_OFFSET + (token_id - TOKEN_ID_OFFSET + j) % len(WORDS)
        out.append((chosen - _STEP * j, other))
    return out[: max(0, k)]


def token_text(token_id: int, first: bool) -> str:
    """A token's text as the OpenAI logprobs show it (a leading space but on the first)."""
    if token_id in SPECIAL_TEXT:
        return SPECIAL_TEXT[token_id]
    return word(token_id) if first else " " + word(token_id)


def generate_fields(ids: list[int], top_k: int) -> dict[str, Any]:
    """``/generate``'s ``meta_info`` fields of ``return_logprob`` (no prompt logprobs: SGLang's
    default ``logprob_start_len`` -1 gives an empty input list)."""
    fields: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [[logprob(i), i, None] for i in ids],
        "output_token_logprobs_length": len(ids),
    }
    if top_k > 0:
        fields["input_top_logprobs"] = []
        fields["output_top_logprobs"] = [[[lp, t, None] for lp, t in top(i, top_k)] for i in ids]
    return fields


def completion_logprobs(ids: list[int], start: int, top_k: int) -> dict[str, Any]:
    """A completion choice's ``logprobs`` for ``ids`` (``start``: tokens before them)."""
    texts = [token_text(t, start + n == 0) for n, t in enumerate(ids)]
    tops = (
        [{token_text(t, start + n == 0): lp for lp, t in top(i, top_k)}
         for n, i in enumerate(ids)]
        if top_k > 0
        else []
    )  # fmt: skip
    return {
        "text_offset": [-1] * len(ids),
        "token_logprobs": [logprob(i) for i in ids],
        "tokens": texts,
        "top_logprobs": tops,
    }


def chat_logprobs(ids: list[int], start: int, top_k: int) -> dict[str, Any]:
    """A chat choice's ``logprobs`` for ``ids`` (``start``: tokens before them)."""

    def entry(token_id: int, first: bool, lp: float) -> dict[str, Any]:
        text = token_text(token_id, first)
        return {"token": text, "bytes": list(text.encode()), "logprob": lp}

    content = []
    for n, i in enumerate(ids):
        first = start + n == 0
        item = entry(i, first, logprob(i))
        item["top_logprobs"] = [entry(t, first, lp) for lp, t in top(i, top_k)]
        content.append(item)
    return {"content": content}
