"""Shared fixtures: one small local Ray cluster per test process (each start costs ~4 s), and
how the run is spread over xdist workers (pyproject's addopts: ``-n auto``)."""

from __future__ import annotations

import collections
import os
import signal
import tempfile

# Started in the background by a non-interactive shell (`cmd &`), this process ignores SIGINT,
# and so would every driver a test starts: Python keeps an inherited SIG_IGN, and the Ctrl-C
# tests would see a driver that cannot be interrupted. A handler (unlike SIG_IGN) is reset to
# the default on exec, so the children start as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Before ray is imported anywhere: no auth token file, no usage-stats banner, and no silent
# `ray.init()` by the first Ray call of a process without a cluster (it would start one with
# this machine's 0 GPUs, and a study on it waits for its 8 until the test times out).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")

from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

# Each xdist worker starts its own private Ray cluster and twins: past a few workers that costs
# more memory and start-up than it saves.
MAX_WORKERS = 4
# The real-SGLang tests share session fixtures (the tiny models; each real server start serves
# several tests): one worker runs the whole folder while the others run the rest beside it.
REAL_SGLANG = "tests/real_sglang/"


def _work_unit(nodeid: str) -> str:
    """A test file, or the real-SGLang folder: module and folder fixtures are built once."""
    path = nodeid.split("::", 1)[0]
    return REAL_SGLANG if path.startswith(REAL_SGLANG) else path


# The fast lane (`pytest -m "not slow"`, the edit loop) leaves out what starts processes,
# clusters or studies: these folders, tests using these fixtures, and test modules that import
# a starter (a study, a CLI run, a server or a subprocess).
SLOW_FOLDERS = ("tests/real_sglang/", "tests/contract_tests/", "tests/chaos_tests/",
                "tests/reliability_tests/")  # fmt: skip
SLOW_FIXTURES = frozenset({"ray_cluster", "sglang_python", "start_twin", "study", "fake_server"})
STARTERS = frozenset({
    "run_study", "subprocess", "TwinProcess", "SGLangBackend", "TwinBackend", "SimulatedTrials",
    "ReplayedTrials", "given", "multiprocessing", "load_benchmark", "serving", "RayNcclScreen",
    "TorchNcclScreen",
})  # fmt: skip


def _is_slow(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    module = getattr(item, "module", None)
    return (
        path.startswith(SLOW_FOLDERS)
        or not SLOW_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        or (module is not None and not STARTERS.isdisjoint(vars(module)))
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the slow tests (see ``SLOW_FOLDERS``). Under xdist, the work units in the order
    they are handed out: the real-SGLang folder (the longest), then files by their number of
    tests, fewest first (the end-to-end studies are files of a few long tests), so short tests
    fill the end. A stable sort: each file keeps its order. A run in one process (``-n 0``)
    keeps pytest's order."""
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    sizes = collections.Counter(_work_unit(item.nodeid) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int, str]:
        unit = _work_unit(item.nodeid)
        return (unit != REAL_SGLANG, sizes[unit], unit)

    items.sort(key=rank)


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - xdist is in the test extra; `-p no:xdist` still runs
    pass
else:

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's ``loadfile`` with the real-SGLang folder as one unit, handed out in the
        order of the collection (see ``pytest_collection_modifyitems``)."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    # The real-SGLang conftest prints what each real server did from its worker's RUNS; under
    # xdist the workers hand their lines to the controller, which prints them.
    _REAL_LINES = "real_sglang_lines"
    _real_lines_of_workers: list[str] = []

    def pytest_sessionfinish(session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            from tests.real_sglang._runs import RUNS
            from tests.real_sglang._runs import summary

            workeroutput[_REAL_LINES] = [summary(run) for run in RUNS]

    def pytest_testnodedown(node: Any, error: object) -> None:
        _real_lines_of_workers.extend(getattr(node, "workeroutput", {}).get(_REAL_LINES, []))

    def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
        for line in _real_lines_of_workers:
            terminalreporter.write_line(f"real SGLang {line}")

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FileScheduling:
        return FileScheduling(config, log)

    def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
        """``-n auto``: one worker per CPU this process may use, at most ``MAX_WORKERS``."""
        return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def start_local_ray() -> None:
    """The session's private local cluster with 8 fake GPUs (``address="local"`` never joins
    another); a test that needs another cluster shuts it down and calls this again after."""
    import ray

    # Ray starts its workers at niceness 15: on a 2-core machine whose other xdist worker runs
    # CPU-bound tests at 0, actors (and anything they start) then crawl. rayspec's own private
    # cluster does the same (rayspec.tune._cluster).
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(
        address="local",
        num_cpus=4,
        num_gpus=8,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 1024**2,
        _temp_dir=tempfile.mkdtemp(prefix="rayspec-ray-"),
    )


_session_ray: list[bool] = []  # [True] once this process's ray_cluster fixture has run


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A private local cluster with 8 fake GPUs (``address="local"`` never joins another)."""
    import ray

    if not ray.is_initialized():
        start_local_ray()
    _session_ray.append(True)
    yield
    ray.shutdown()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that needs the session's cluster gets it back if an earlier test of this process
    ended it (a cluster of its own, or a `connect()` that shut Ray down on an exception): before
    any fixture of the test is built, module-scoped ones included."""
    if not _session_ray or "ray_cluster" not in getattr(item, "fixturenames", ()):
        return
    import ray

    if not ray.is_initialized():
        start_local_ray()
