"""Test scaffolding for the real SGLang server on a CPU, loaded by every Python started with
``tests/real_sglang/_site`` on ``PYTHONPATH`` (the server and each child it spawns).

It does nothing unless asked, through the environment only, so that the command line stays
exactly what rayspec launches (``python -m sglang.launch_server`` plus the candidate's flags):

* ``RAYSPEC_TEST_FAKE_AMX=1``: tell SGLang's server-argument resolution that this CPU has Intel
  AMX (``sglang.srt.runtime_context._PlatformOverride(has_amx=True)``), installed the moment
  that module is first imported. SGLang otherwise swaps its ``intel_amx`` attention backend,
  the only CPU backend with an EAGLE path, for ``torch_native``. Model layers ask the hardware
  themselves and keep their plain-torch paths; the attention ops come from the ``sgl_kernel``
  stand-in beside this file.
* ``RAYSPEC_TEST_SITE_LOG=<file>``: append one line per process that loaded this file
  (pid, parent pid, argv), so a test can check the scaffolding reached every child.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_TARGET = "sglang.srt.runtime_context"


def _log_process() -> None:
    path = os.environ.get("RAYSPEC_TEST_SITE_LOG")
    if not path:
        return
    line = f"{os.getpid()} {os.getppid()} {sys.argv!r}\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def _install_fake_amx(module: ModuleType) -> None:
    module._PlatformOverride(has_amx=True).install()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``_TARGET`` with the regular finders, then runs a hook once it has executed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _install_fake_amx(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_log_process()
if os.environ.get("RAYSPEC_TEST_FAKE_AMX") == "1":
    sys.meta_path.insert(0, _AfterImport())
