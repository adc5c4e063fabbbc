"""Shared fixtures: one small local Ray cluster for the whole run (each start costs ~4 s)."""

from __future__ import annotations

import os
import signal
import tempfile

# Started in the background by a non-interactive shell (`cmd &`), this process ignores SIGINT,
# and so would every driver a test starts: Python keeps an inherited SIG_IGN, and the Ctrl-C
# tests would see a driver that cannot be interrupted. A handler (unlike SIG_IGN) is reset to
# the default on exec, so the children start as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Before ray is imported anywhere: no auth token file, no usage-stats banner.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402


def start_local_ray() -> None:
    """The session's private local cluster with 8 fake GPUs (``address="local"`` never joins
    another); a test that needs another cluster shuts it down and calls this again after."""
    import ray

    ray.init(
        address="local",
        num_cpus=4,
        num_gpus=8,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 1024**2,
        _temp_dir=tempfile.mkdtemp(prefix="rayspec-ray-"),
    )


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A private local cluster with 8 fake GPUs (``address="local"`` never joins another)."""
    import ray

    if not ray.is_initialized():
        start_local_ray()
    yield
    ray.shutdown()
