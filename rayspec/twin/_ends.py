"""How a twin request ends, decided token by token as the engine generates it.

SGLang ends a request at its token budget (``finish_reason`` ``length``), at the model's
end-of-sequence token unless ``ignore_eos`` (``stop``), at a ``stop`` string or a
``stop_token_ids`` token (``stop``, with ``matched``), none of them before ``min_new_tokens``.
:class:`Completion` makes a request's token ids as the engine asks for them and checks each new
token against those conditions as it comes: a request never holds more than it has generated,
and a stop string is looked for in the last few characters only (never the whole text again),
so a long budget costs the engine nothing up front and each token O(1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rayspec.twin._text import EOS_TOKEN_ID
from rayspec.twin._text import PAD_TOKEN_ID
from rayspec.twin._text import CompletionIds
from rayspec.twin._text import Corruption
from rayspec.twin._text import eos_position
from rayspec.twin._text import word

# SGLang's MAX_STOP_COUNT (sampling_params.py): more stop strings are refused.
MAX_STOP_STRINGS = 1024


@dataclasses.dataclass(frozen=True)
class Stops:
    """What ends a request before its budget: SGLang's ``stop``, ``stop_token_ids``,
    ``ignore_eos``, ``min_new_tokens`` and ``no_stop_trim`` sampling parameters."""

    strings: tuple[str, ...] = ()
    token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    no_stop_trim: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Stops:
        """From ``sampling_params`` (or an OpenAI body: the same names, ``min_tokens``).

        Raises:
            ValueError: more stop strings than SGLang takes.
            TypeError: a value of the wrong type (the caller checked the types first).
        """
        stop = params.get("stop")
        strings = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or ())
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(strings)}"
            )
        min_new = params.get("min_new_tokens", params.get("min_tokens")) or 0
        return cls(
            strings=tuple(s for s in strings if s),
            token_ids=frozenset(int(t) for t in params.get("stop_token_ids") or ()),
            ignore_eos=bool(params.get("ignore_eos")),
            min_new_tokens=max(0, int(min_new)),
            no_stop_trim=bool(params.get("no_stop_trim")),
        )


@dataclasses.dataclass(frozen=True)
class End:
    """How a request ended."""

    finish: dict[str, Any]  # SGLang's meta_info finish_reason
    trim_at: int | None = None  # the final text is cut here (a matched stop string)
    drop_last: bool = False  # the matched stop token has no text


class _StopStrings:
    """Finds the first stop string in a text that grows one word at a time.

    Only the last ``longest - 1`` characters of the text are kept: a stop string that ends in
    the new word starts at most that far back, so each word costs O(longest), not O(text).
    Positions are of the whole text (the final text is cut at the match).
    """

    def __init__(self, strings: tuple[str, ...]) -> None:
        self.strings = strings
        self.longest = max(len(s) for s in strings)
        self.length = 0  # characters of the whole text
        self._tail = ""  # its last longest - 1 characters

    def feed(self, token_word: str) -> tuple[int, str] | None:
        """Append a word; the (position, string) of the earliest match it completes."""
        piece = f" {token_word}" if self.length else token_word
        window = self._tail + piece
        origin = self.length - len(self._tail)  # the window's position in the whole text
        self.length += len(piece)
        # A match must end within the new piece: it starts at or after this position.
        first = max(0, self.length - len(piece) - self.longest + 1) - origin
        hits = [(window.find(s, first), s) for s in self.strings]
        found = [(at + origin, s) for at, s in hits if at >= 0]
        keep = self.longest - 1
        self._tail = window[-keep:] if keep else ""
        return min(found) if found else None


class Completion:
    """The output of one request, made as the engine asks for it.

    Args:
        seed: the model's text seed (one text per prompt, like greedy decoding).
        prompt_key: the prompt (its text, or its ids as JSON).
        budget: ``max_new_tokens``.
        stops: the request's stop conditions.
        corrupt: the collectives corrupt data (LL128 on PCIe): tokens are replaced.
        pad: every token is the pad token (a special token with no text), as a model whose
            greedy output is its pad token gives (``--twin-text pad``).
        eos_at: where the answer's end-of-sequence token is (1-based); None: the prompt's
            (:func:`~rayspec.twin._text.eos_position`).
    """

    def __init__(
        self,
        seed: int,
        prompt_key: str,
        budget: int,
        stops: Stops,
        *,
        corrupt: bool = False,
        pad: bool = False,
        eos_at: int | None = None,
    ) -> None:
        self.budget = max(0, budget)
        self.stops = stops
        eos_at = eos_position(seed, prompt_key) if eos_at is None else eos_at
        # The end-of-sequence token ends the request where it can (the tokens past it are
        # never generated: a budget without limit costs no more than the answer).
        self._eos_at = (
            eos_at
            if not stops.ignore_eos and stops.min_new_tokens < eos_at <= self.budget
            else None
        )
        self._ids = CompletionIds(seed, prompt_key)
        self._corruption = Corruption(prompt_key) if corrupt else None
        self._pad = pad
        self._strings = _StopStrings(stops.strings) if stops.strings else None
        self.made = 0
        self.end: End | None = None if self.budget else End({"type": "length", "length": 0})

    def _next_id(self) -> int:
        token = self._ids.next()
        if self._corruption is not None:
            token = self._corruption.apply(token)
        return PAD_TOKEN_ID if self._pad else token

    def take(self, n: int) -> tuple[list[int], bool]:
        """The next ``n`` token ids or fewer, and whether the last of them ends the request."""
        out: list[int] = []
        stops = self.stops
        while len(out) < n and self.end is None:
            position = self.made + 1
            self.made = position
            if position == self._eos_at:  # generated and counted, and it has no text
                out.append(EOS_TOKEN_ID)
                self.end = End({"type": "stop", "matched": EOS_TOKEN_ID})
                break
            token = self._next_id()
            out.append(token)
            # The text grows from the first token; stops count only past min_new_tokens.
            hit = None
            if self._strings is not None and token != PAD_TOKEN_ID:
                hit = self._strings.feed(word(token))
            if position > stops.min_new_tokens:
                if token in stops.token_ids:
                    finish = {"type": "stop", "matched": token}
                    self.end = End(finish, drop_last=not stops.no_stop_trim)
                elif hit is not None:
                    at, matched = hit
                    finish = {"type": "stop", "matched": matched}
                    self.end = End(finish, trim_at=None if stops.no_stop_trim else at)
            if self.end is None and position >= self.budget:
                self.end = End({"type": "length", "length": self.budget})
        return out, self.end is not None
