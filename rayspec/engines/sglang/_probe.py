"""SGLang's version, asked of the interpreter that runs the server (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from importlib.util import find_spec

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
    """Ask ``python`` for ``sglang.__version__`` (a subprocess: argv, no shell, a timeout).

    The interpreter running rayspec needs no subprocess when SGLang is not even installed.
    """
    if python == sys.executable and find_spec("sglang") is None:
        return InstalledSGLang(None, missing=True)
    try:
        proc = subprocess.run(
            [python, "-c", _ASK_VERSION],
            capture_output=True,
            text=True,
            timeout=SGLANG_IMPORT_TIMEOUT_S,
            env=dict(os.environ if env is None else env),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return InstalledSGLang(
            None, error=f"import sglang did not finish within {SGLANG_IMPORT_TIMEOUT_S:.0f} s"
        )
    except OSError as exc:
        return InstalledSGLang(None, error=f"cannot run it ({exc.strerror})")
    if proc.returncode == _MISSING_EXIT:
        return InstalledSGLang(None, missing=True)
    for line in proc.stdout.splitlines():
        if line.startswith(_VERSION_MARK):
            return InstalledSGLang(line[len(_VERSION_MARK) :].strip())
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {proc.returncode}, no output"
    return InstalledSGLang(None, error=f"import sglang fails: {last}")
