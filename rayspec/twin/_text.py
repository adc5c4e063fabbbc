"""Deterministic pseudo-text for the twin: one token is one word.

The words of a completion depend only on the twin's seed and the prompt, like greedy decoding of a
real model: the same prompt gives the same text. Token ids are the word's index plus an offset, so
they look like vocabulary ids.
"""

from __future__ import annotations

import random
import zlib

_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ne",
    "su",
    "ta",
    "ri",
    "vo",
    "pe",
    "da",
    "fu",
    "ge",
    "ho",
    "ji",
    "ba",
    "zo",
)
WORDS: tuple[str, ...] = tuple(
    a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in ("", "n", "s", "r")
)
TOKEN_ID_OFFSET = 1000
EOS_TOKEN_ID = TOKEN_ID_OFFSET - 1  # the twin model's end-of-sequence token (a special token)
EOS_TEXT = "[EOS]"  # its text, seen only with skip_special_tokens false (Kimi's eos token)
# The pad token, another special token: an answer of pad tokens has no text at all (a real
# model whose greedy pick is its pad token, as the tiny always-agreeing pair of the real-SGLang
# tests; the twin gives it with --twin-text pad).
PAD_TOKEN_ID = TOKEN_ID_OFFSET - 2
PAD_TEXT = "[PAD]"
SPECIAL_TEXT = {EOS_TOKEN_ID: EOS_TEXT, PAD_TOKEN_ID: PAD_TEXT}
_SPECIAL_ID = {text: token for token, text in SPECIAL_TEXT.items()}
# UNCALIBRATED: how long the twin's own answer to a prompt runs before its end-of-sequence
# token: at least _EOS_MIN tokens, plus an exponential tail of mean _EOS_MEAN_TAIL. Long enough
# that a short request always gets its whole budget; benchmarks send ignore_eos anyway.
_EOS_MIN = 512
_EOS_MEAN_TAIL = 512.0


def count_prompt_tokens(text: str) -> int:
    """Prompt length in twin tokens: the number of whitespace-separated words (at least 1)."""
    return max(1, len(text.split()))


class CompletionIds:
    """The token ids of the completion of ``prompt_key`` under ``seed``, one at a time, so a
    request never holds more of its output than it has generated (``completion_ids`` is the
    same sequence, all at once)."""

    def __init__(self, seed: int, prompt_key: str) -> None:
        crc = zlib.crc32(prompt_key.encode("utf-8", "surrogatepass"))
        self._rng = random.Random((seed & 0xFFFFFFFF) << 32 | crc)

    def next(self) -> int:
        return TOKEN_ID_OFFSET + self._rng.randrange(len(WORDS))


def completion_ids(seed: int, prompt_key: str, n: int) -> list[int]:
    """The first ``n`` token ids of the completion of ``prompt_key`` under ``seed``."""
    ids = CompletionIds(seed, prompt_key)
    return [ids.next() for _ in range(n)]


def word(token_id: int) -> str:
    """The text of one (non-special) twin token."""
    return WORDS[(token_id - TOKEN_ID_OFFSET) % len(WORDS)]


_WORD_INDEX = {word: i for i, word in enumerate(WORDS)}


def encode(text: str) -> list[int]:
    """Twin token ids of ``text``: one per whitespace-separated word (a word outside the twin's
    vocabulary gets a stable id of its own; ``EOS_TEXT`` and ``PAD_TEXT`` are the special
    tokens), so ``detokenize(encode(t), skip_special_tokens=False)`` gives back twin text."""
    return [
        _SPECIAL_ID[w]
        if w in _SPECIAL_ID
        else TOKEN_ID_OFFSET
        + _WORD_INDEX.get(w, zlib.crc32(w.encode("utf-8", "surrogatepass")) % len(WORDS))
        for w in text.split()
    ]


def eos_position(seed: int, prompt_key: str) -> int:
    """Where the twin's answer to ``prompt_key`` ends: the 1-based position of its
    end-of-sequence token (the same for every start of one model, like greedy decoding)."""
    crc = zlib.crc32(("eos:" + prompt_key).encode("utf-8", "surrogatepass"))
    rng = random.Random((seed & 0xFFFFFFFF) << 32 | crc)
    return _EOS_MIN + int(rng.expovariate(1.0 / _EOS_MEAN_TAIL))


def detokenize(ids: list[int], *, skip_special_tokens: bool = True) -> str:
    """Space-joined words of ``ids`` (the first word has no leading space). The
    end-of-sequence and pad tokens are special tokens: no text unless ``skip_special_tokens``
    is false, as a Hugging Face tokenizer's ``decode`` does."""
    return " ".join(
        SPECIAL_TEXT[i] if i in SPECIAL_TEXT else WORDS[(i - TOKEN_ID_OFFSET) % len(WORDS)]
        for i in ids
        if i not in SPECIAL_TEXT or not skip_special_tokens
    )


def delta_text(ids: list[int], start: int, *, after_text: bool | None = None) -> str:
    """The text that ``ids[start:]`` adds to ``detokenize(ids[:start])``; ``after_text``:
    whether that text is not empty (the caller's count; computed when None)."""
    text = detokenize(ids[start:])
    if after_text is None:
        after_text = bool(detokenize(ids[:start]))
    return " " + text if text and after_text else text


def model_seed(profile_name: str) -> int:
    """The seed of a model's greedy text: the same for every server start of one profile.

    Greedy decoding is deterministic for a given model and prompt, whatever the NCCL set or the
    speculative settings (SGLang verifies drafts against the target), so the twin's output
    depends on the profile and the prompt only, not on ``--twin-seed``.
    """
    return zlib.crc32(profile_name.encode("utf-8"))


# Where corrupted output starts (tokens into the completion) and how often it strikes after.
_CORRUPT_FROM = 6
_CORRUPT_EVERY = 5


class Corruption:
    """The output of a server whose collectives corrupt data: LL128 forced on a PCIe ring.

    NCCL honours ``NCCL_PROTO=LL128`` on PCIe although LL128 relies on 128-byte store ordering
    that only NVLink guarantees (silent corruption, NVIDIA/nccl PR #2053): the twin replaces a
    token every few positions from early on, deterministically per prompt. The speed is LL128's.
    :meth:`apply` takes the completion's tokens in order, one at a time.
    """

    def __init__(self, prompt_key: str) -> None:
        key = ("corrupt:" + prompt_key).encode("utf-8", "surrogatepass")
        self._rng = random.Random(zlib.crc32(key))
        self._next = _CORRUPT_FROM + self._rng.randrange(_CORRUPT_EVERY)
        self._position = 0

    def apply(self, token_id: int) -> int:
        at = self._position
        self._position += 1
        if at != self._next:
            return token_id
        self._next += _CORRUPT_EVERY
        shift = 1 + self._rng.randrange(7)
        return TOKEN_ID_OFFSET + (token_id - TOKEN_ID_OFFSET + shift) % len(WORDS)


def corrupt_ids(ids: list[int], prompt_key: str) -> list[int]:
    """``ids`` as a server whose collectives corrupt data outputs them (:class:`Corruption`)."""
    corruption = Corruption(prompt_key)
    return [corruption.apply(i) for i in ids]
