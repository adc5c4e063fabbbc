"""Prompt sets shipped with rayspec, and the deterministic choice of a request's inputs.

A benchmark must send the same requests to every candidate, so nothing here depends on the
clock, the process or Python's salted ``hash``: a request's prompt and length are a pure
function of ``(scenario, run, index)``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import random
from typing import TYPE_CHECKING

from rayspec._exceptions import ConfigError

if TYPE_CHECKING:
    from rayspec.bench._plan import Scenario

_BUILTIN_DIR = pathlib.Path(__file__).parent / "prompts"


def builtin_prompt_sets() -> tuple[str, ...]:
    """Names of the prompt sets shipped in ``rayspec/bench/prompts/``."""
    return tuple(sorted(p.stem for p in _BUILTIN_DIR.glob("*.jsonl")))


@functools.lru_cache(maxsize=16)
def load_prompts(name_or_path: str) -> tuple[str, ...]:
    """Load a prompt set.

    Args:
        name_or_path: a built-in name (``"default"``: 64 varied long-answer prompts) or the path
            of a JSONL file whose lines are objects with a ``"prompt"`` (or ``"text"``) string.

    Returns:
        The prompts, in file order.

    Raises:
        ConfigError: the name is unknown, the file is missing or a line is malformed.

    Example:
        >>> len(load_prompts("default"))
        64
    """
    path = _BUILTIN_DIR / f"{name_or_path}.jsonl"
    if not path.is_file():
        path = pathlib.Path(name_or_path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"prompt set {name_or_path!r}: neither a built-in set "
            f"({', '.join(builtin_prompt_sets())}) nor an existing JSONL file"
        )
    prompts: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{path}:{lineno}: expected an object with a 'prompt' string")
        prompts.append(text)
    if not prompts:
        raise ConfigError(f"{path}: the prompt set is empty")
    return tuple(prompts)


@dataclasses.dataclass(frozen=True)
class RequestInput:
    """What one request sends."""

    prompt: str
    max_tokens: int


def _rng(scenario: Scenario, *parts: object) -> random.Random:
    key = "\x1f".join(str(p) for p in (scenario.name, scenario.seed, *parts))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def request_input(scenario: Scenario, run: int, index: int) -> RequestInput:
    """The prompt and length of request ``index`` of run ``run`` (``-1`` = warm-up).

    Measured requests walk through the prompt set from a per-scenario offset (run ``r``, index
    ``i`` takes position ``offset + r * requests_per_run + i``), so one run never repeats a
    prompt while the set is large enough; warm-up requests walk backwards from the offset, so
    they avoid the first measured prompts.

    Example:
        >>> from rayspec.bench import Scenario
        >>> s = Scenario(name="c1")
        >>> request_input(s, 0, 0) == request_input(s, 0, 0)
        True
    """
    prompts = load_prompts(scenario.prompt_set)
    offset = _rng(scenario, "offset").randrange(len(prompts))
    seq = run * scenario.requests_per_run + index if run >= 0 else -(index + 1)
    pos = (offset + seq) % len(prompts)
    prompt = prompts[pos]
    rng = _rng(scenario, "lengths", run, index)
    max_tokens = scenario.max_tokens
    if scenario.output_len_range is not None:
        max_tokens = rng.randint(*scenario.output_len_range)
    if scenario.input_len_range is not None:
        target = rng.randint(*scenario.input_len_range)
        words = prompt.split()
        nxt = pos
        while len(words) < target:
            nxt = (nxt + 1) % len(prompts)
            words.extend(prompts[nxt].split())
        prompt = " ".join(words[:target])
    return RequestInput(prompt=prompt, max_tokens=max_tokens)
