"""SGLang's version, asked of the interpreter that runs the server (a subprocess)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib.util import find_spec

from rayspec._exceptions import LaunchError
from rayspec._popen import run_to_end
from rayspec.engines._base import Installed

#: ``import sglang`` imports torch and CUDA libraries: seconds, more on a cold disk.
SGLANG_IMPORT_TIMEOUT_S = 180.0

_MISSING_EXIT = 3
_VERSION_MARK = "rayspec-sglang-version="
_ASK_VERSION = (
    "import importlib.util, sys\n"
    f"if importlib.util.find_spec('sglang') is None: sys.exit({_MISSING_EXIT})\n"
    "import sglang\n"
    f"print('{_VERSION_MARK}' + sglang.__version__)\n"
)


#: What the server's interpreter said about SGLang.
InstalledSGLang = Installed


def probe_sglang(python: str, env: Mapping[str, str] | None = None) -> InstalledSGLang:
    """Ask ``python`` for ``sglang.__version__`` (a subprocess through :mod:`rayspec._popen`:
    argv, no shell, a timeout that kills its process group).

    The interpreter running rayspec needs no subprocess when SGLang is not even installed.
    """
    if python == sys.executable and find_spec("sglang") is None:
        return InstalledSGLang(None, missing=True)
    try:
        proc = run_to_end(
            [python, "-c", _ASK_VERSION],
            dict(os.environ if env is None else env),
            SGLANG_IMPORT_TIMEOUT_S,
            what="the SGLang version probe",
        )
    except LaunchError as exc:
        cause = exc.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        return InstalledSGLang(None, error=f"cannot run it ({why})")
    if proc.returncode is None:  # killed at the timeout, its process group with it
        return InstalledSGLang(
            None, error=f"import sglang did not finish within {SGLANG_IMPORT_TIMEOUT_S:.0f} s"
        )
    if proc.returncode == _MISSING_EXIT:
        return InstalledSGLang(None, missing=True)
    for line in proc.stdout.splitlines():
        if line.startswith(_VERSION_MARK):
            return InstalledSGLang(line[len(_VERSION_MARK) :].strip())
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {proc.returncode}, no output"
    return InstalledSGLang(None, error=f"import sglang fails: {last}")
