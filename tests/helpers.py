"""Small helpers shared by tests: writing experiment files, the experiments of experiments/
read once per session, free ports."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import http.server
import importlib.util
import os
import sys
import threading
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

import yaml

if TYPE_CHECKING:
    from rayspec._config import ExperimentConfig
    from rayspec.twin._profile import Profile

# The tests' one home of a free port (the OS's pick, never a fixed one): import them from here.
from rayspec.testing._twin import free_port  # noqa: F401
from rayspec.testing._twin import free_port_block  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (not a package) as module ``benchmark_<name>``."""
    path = os.path.join(REPO, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


TWIN_EXPERIMENT = os.path.join(REPO, "experiments", "eagle3-twin.yaml")
# Where the README's sections went (issue 34): the front door links every one of them, and the
# doc tests check each as they checked the README.
README_HOMES = (
    "docs/output.md", "docs/search.md", "docs/config.md", "docs/measurement.md",
    "docs/real-node.md", "docs/cluster.md", "docs/failures.md", "docs/twin.md",
    "docs/twin-model.md", "CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/results/README.md",
)  # fmt: skip
FIELD_EXPERIMENT = os.path.join(REPO, "experiments", "eagle3.yaml")


@functools.cache
def _parsed(path: str, overrides: tuple[str, ...]) -> ExperimentConfig:
    from rayspec._config import load_config

    return load_config(path, overrides)


def cached_config(
    path: str = TWIN_EXPERIMENT,
    overrides: Sequence[str] = (),
    *,
    out: str | os.PathLike[str] | None = None,
) -> ExperimentConfig:
    """``load_config(path, overrides)``, parsed once per session (a load is ~50-100 ms): each
    call returns a deep copy of that parse, since the config's dataclasses are mutable and no
    test may see another's changes. ``out`` sets ``output.dir`` on the copy, as the override
    ``output.dir=<out>`` would (that key is only checked for control characters), so every
    ``tmp_path`` shares one parse.

    Only for the files of experiments/ (and clusters/ files as overrides): files no test
    writes. A file a test writes, or an override that reads the environment
    (``${oc.env:...}``, resolved once), goes through ``load_config``; so does a refusal, which
    is never cached.
    """
    if os.path.dirname(os.path.abspath(path)) != os.path.join(REPO, "experiments"):
        raise ValueError(f"{path}: cached_config reads only experiments/ (use load_config)")
    cfg = copy.deepcopy(_parsed(path, tuple(overrides)))
    if out is not None:
        cfg.output = dataclasses.replace(cfg.output, dir=os.fspath(out))
    return cfg


def pids_alive(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` that still exist as non-zombie processes (read from /proc)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX":  # the state follows the command's name
            alive.append(pid)
    return alive


def without_noise(profile: Profile) -> Profile:
    """The twin's ``profile`` with every noise sigma at 0 (a deterministic model)."""
    from rayspec.twin._profile import NoiseProfile

    return dataclasses.replace(profile, noise=NoiseProfile.off())


def write_experiment(folder: str, doc: dict[str, Any], name: str = "exp.yaml") -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


def twin_doc(out_dir: str, **sections: Any) -> dict[str, Any]:
    """A minimal twin experiment; ``sections`` update it one level deep."""
    doc: dict[str, Any] = {
        "study": {"name": "t", "n_trials": 3},
        "server": {"engine": "twin"},
        "output": {"dir": out_dir},
    }
    for key, value in sections.items():
        doc.setdefault(key, {}).update(value)
    return doc


@contextlib.contextmanager
def prometheus_exporter(text: str) -> Iterator[str]:
    """A Prometheus exporter on 127.0.0.1 serving ``text`` at /metrics; yields host:port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = text.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def single_and_c8_requests() -> tuple[Any, ...]:
    """One trial's requests at two scenarios: one at concurrency 1 (``single``), eight at 8
    (``c8``), each 100 tokens in 1 s (the report tests' load fixtures)."""
    from rayspec import RequestRecord

    return tuple(
        RequestRecord(
            scenario=sc, run=0, index=i, concurrency=c, prompt_tokens=20, completion_tokens=100,
            ttft_ms=50.0, e2e_ms=1000.0, itl_ms=(), start_unix_s=1.0,
        )
        for sc, c in (("single", 1), ("c8", 8)) for i in range(c)
    )  # fmt: skip
