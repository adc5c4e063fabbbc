"""Runs INSIDE the cached SGLang env (never imported by rayspec's tests): resolve launch lines.

Usage: ``<sglang-env>/bin/python _sglang_probe.py REQUEST.json RESULT.json``

REQUEST.json is ``{"cases": [{"id": str, "argv": [flags...], "env": {name: value},
"unset_env": [name...], "entry": "prepare" | "launch_server"}]}``. ``argv`` is what follows
``python -m sglang.launch_server``. Each case is handled in this one process (importing SGLang
takes seconds) the way ``sglang.launch_server`` does: ``prepare_server_args(argv)``, then
``ServerArgs.resolve_once()``, then the effective values read through SGLang's own
``resolving_view``. Entry ``launch_server`` runs the real module as ``__main__`` instead
(only for lines that must be rejected while parsing: a valid one would start a server).

RESULT.json maps each id to ``{"ok": true, "values": {...}, "log": [...]}`` or
``{"ok": false, "error": type name, "message": str, "exit_code": int | None,
"stderr": str, "log": [...]}``. Entry ``parse`` stops after ``prepare_server_args``: its
``values`` are every field as the parser set it, and ``options`` every option string.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import runpy
import sys
import warnings
from typing import Any

warnings.simplefilter("ignore")  # SGLang's import warns about CPU-less kernels; not ours

from sglang.srt.arg_groups.overrides import resolving_view  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

FIELDS = (
    "device",
    "model_path",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "disable_overlap_schedule",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "chunked_prefill_size",
    "attention_backend",
    "mem_fraction_static",
    "tp_size",
    "host",
    "port",
    "trust_remote_code",
    "enable_metrics",
    "disable_custom_all_reduce",
)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "value") and isinstance(value.value, str):  # enums
        return value.value
    return str(value)


def _effective(server_args: Any) -> dict[str, Any]:
    view = resolving_view(server_args)
    values = {name: _plain(getattr(view, name)) for name in FIELDS}
    # What the decode CUDA graphs are captured up to: the flag's value after the
    # GPU-memory defaults and clamps of cuda_graph_hook/memory_hook.
    graph = getattr(view, "cuda_graph_config", None)
    decode = getattr(graph, "decode", None)
    values["decode_graph_max_bs"] = getattr(decode, "max_bs", None)
    values["decode_graph_backend"] = _plain(getattr(decode, "backend", None))
    return values


def _parser() -> argparse.ArgumentParser:
    """The parser ``prepare_server_args`` builds."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    assert parser.allow_abbrev  # the reason rayspec matches prefixes
    return parser


def _parsed(server_args: Any) -> dict[str, Any]:
    """Every option's field as SGLang's parser set it (entry ``parse``: no resolution)."""
    dests = {a.dest for a in _parser()._actions if a.option_strings and a.dest != "help"}
    return {d: _plain(getattr(server_args, d, None)) for d in sorted(dests)}


def _options() -> list[str]:
    """Every option string of SGLang's parser."""
    return sorted(o for action in _parser()._actions for o in action.option_strings)


@contextlib.contextmanager
def _environ(env: dict[str, str], unset: list[str]) -> Any:
    saved = dict(os.environ)
    os.environ.update(env)
    for name in unset:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run(case: dict[str, Any]) -> dict[str, Any]:
    argv = list(case["argv"])
    lines = _Lines()
    stderr = io.StringIO()
    out: dict[str, Any]
    try:
        with _environ(case.get("env", {}), case.get("unset_env", [])):
            with contextlib.redirect_stderr(stderr):
                if case.get("entry") == "launch_server":
                    sys.argv = ["sglang.launch_server", *argv]
                    runpy.run_module("sglang.launch_server", run_name="__main__")
                    raise RuntimeError("launch_server returned: the line was not rejected")
                server_args = prepare_server_args(argv)
                if case.get("entry") == "parse":  # what the parser read, before resolution
                    return {"ok": True, "values": _parsed(server_args), "options": _options()}
                # prepare_server_args re-installs the root handlers: listen after it.
                logging.getLogger().addHandler(lines)
                server_args.resolve_once()
                out = {"ok": True, "values": _effective(server_args)}
    except SystemExit as exc:  # argparse: usage error
        code = exc.code if isinstance(exc.code, int) else None
        out = {"ok": False, "error": "SystemExit", "message": str(exc), "exit_code": code}
    except Exception as exc:  # reported to the test, which decides
        out = {"ok": False, "error": type(exc).__name__, "message": str(exc), "exit_code": None}
    finally:
        logging.getLogger().removeHandler(lines)
    out["stderr"] = stderr.getvalue()
    out["log"] = lines.lines
    return out


def main() -> None:
    request_path, result_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        request = json.load(f)
    load_plugins()  # as sglang.launch_server does before parsing
    results = {case["id"]: _run(case) for case in request["cases"]}
    with open(result_path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
