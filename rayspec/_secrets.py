"""Secrets in the server's environment: passed to the server, never written down.

``server.env.HF_TOKEN: ${oc.env:HF_TOKEN}`` hands the server a token the experiment read from
the driver's environment. The study writes its launches in many places (the trial rows, the
journal, ``nccl_screen.json``, ``best.sh``, ``best-twin.sh``, ``best.yaml``, ``report.md``); a
variable whose name looks secret (:func:`is_secret`: a part of it between underscores is
``TOKEN``, ``KEY``, ``SECRET``, ``PASSWORD``, ``PASSWD`` or ``CREDENTIAL``, plural too, in any
case) is written everywhere as
:data:`SECRET_VALUE`, and the scripts read it from their own environment when they run
(:func:`secret_lines`). A name that only looks secret (``MONKEY_PATCH``) is treated the same:
the script then asks for it at run time, which costs an ``export``, never a leak.

Standard library only: every package that writes a launch imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from collections.abc import Mapping

__all__ = ["SECRET_VALUE", "is_secret", "redact_env", "secret_lines", "split_secrets"]

# Whole parts of the name (between underscores): TOKENIZERS_PARALLELISM holds no token, and
# a real study sets it (real SGLang's tests: best.sh refused to start without it).
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKENS?|API_?KEYS?|KEYS?|SECRETS?|PASSWORDS?|PASSWD|CREDENTIALS?)(?:_|$)",
    re.IGNORECASE,
)

SECRET_VALUE = "<secret: not written; read from the environment at run time>"
"""What a secret variable's value is written as, wherever the study writes a launch."""


def is_secret(name: str) -> bool:
    """Whether the variable ``name`` looks like it holds a secret.

    Example:
        >>> is_secret("HF_TOKEN"), is_secret("OPENAI_API_KEY"), is_secret("NCCL_PROTO")
        (True, True, False)
    """
    return _SECRET_NAME.search(name) is not None


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each secret's value replaced by :data:`SECRET_VALUE` (order kept)."""
    return {k: SECRET_VALUE if is_secret(k) else v for k, v in env.items()}


def split_secrets(env: Iterable[tuple[str, str]]) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """(the variables that are not secret, the names of those that are), in order."""
    pairs = list(env)
    return tuple((k, v) for k, v in pairs if not is_secret(k)), [
        k for k, _ in pairs if is_secret(k)
    ]


def secret_lines(names: Iterable[str], script: str) -> list[str]:
    """Bash lines that take each secret from the environment the script runs in, and stop
    with a message naming it when it is not set (the names are validated variable names)."""
    names = list(names)
    if not names:
        return []
    what = "a secret" if len(names) == 1 else "secrets"
    lines = [
        f"# {', '.join(names)}: {what}, not written in {script}: read from the environment at "
        "run time (export before running it)"
    ]
    for name in names:
        lines.append(f': "${{{name}:?set {name} in the environment: {script} does not hold it}}"')
        lines.append(f"export {name}")
    return lines
