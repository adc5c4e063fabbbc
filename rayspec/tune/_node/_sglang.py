"""SGLang's version, asked of the interpreter that runs the server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec

from rayspec.server._versions import SGLANG_VERSIONS
from rayspec.server._versions import parse_sglang_version
from rayspec.server._versions import sglang_features
from rayspec.tune._node._findings import Findings

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


@dataclass(frozen=True)
class InstalledSGLang:
    """What the server's interpreter said about SGLang.

    Attributes:
        version: ``sglang.__version__``, or None when it could not be imported.
        missing: SGLang is not installed for that interpreter at all.
        error: why the import failed (one line), when it failed for another reason.
    """

    version: str | None
    missing: bool = False
    error: str = ""


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


def check_sglang(
    found: InstalledSGLang, *, python: str, configured: str, key: str = "server.engine"
) -> Findings:
    """The installed SGLang imports, is in rayspec's version table and is ``configured``.

    Args:
        found: the probe's answer.
        python: the interpreter that was asked (for the messages).
        configured: ``server.sglang_version``.
        key: the key to name for an interpreter problem (``server.python`` when it is set).
    """
    out = Findings()
    if found.version is None:
        if found.missing:
            out.problems.append(
                f"{key}: sglang is not installed for {python}; install it on the GPU node "
                "(pip install 'rayspec[sglang]') or set server.python to the interpreter "
                "that has it"
            )
        else:
            out.problems.append(f"{key}: {python} cannot import sglang: {found.error}")
        return out
    try:
        release = parse_sglang_version(found.version)
    except ValueError:
        out.problems.append(
            f"{key}: {python} reports sglang.__version__ {found.version!r}, which is no version"
        )
        return out
    oldest, newest = SGLANG_VERSIONS[0].since, SGLANG_VERSIONS[-1].since
    if release < oldest:
        out.problems.append(
            f"{key}: SGLang {found.version} ({python}) is older than any version rayspec "
            f"knows ({oldest} and later); install a newer SGLang"
        )
        return out
    if release > newest:
        out.warnings.append(
            f"SGLang {found.version} ({python}) is newer than any version rayspec has "
            f"examined: it is launched as {newest} would be"
        )
    if parse_sglang_version(configured) != release:
        have, want = sglang_features(release), sglang_features(configured)
        why = ""
        if have.cuda_graph_flag != want.cuda_graph_flag:
            why = (
                f" (that SGLang's CUDA-graph cap is {have.cuda_graph_flag}, not "
                f"{want.cuda_graph_flag})"
            )
        out.problems.append(
            f"server.sglang_version: {configured} but {python} has SGLang {found.version}"
            f"{why}; set server.sglang_version={release}"
        )
    return out
