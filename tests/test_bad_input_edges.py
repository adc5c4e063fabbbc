"""Bad input at the edges of the machine (issue 33, low items): what the environment, the file
system and a held port show. Each case: one ``error:`` line naming the key or the variable,
exit 2, no traceback, nothing written; or, where nothing is wrong, no line at all.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.helpers import REPO
from tests.helpers import twin_doc
from tests.helpers import write_experiment
from tests.reliability_tests._support import SUBPROCESS_ENV

# Starts the private cluster as the driver does, then stops it.
_CONNECT = """
import sys
from rayspec._config import load_config
from rayspec.tune._cluster import connect, disconnect
disconnect(connect(load_config(sys.argv[1], sys.argv[2:])))
print("connected", flush=True)
"""


def test_a_held_dashboard_port_says_nothing_with_the_dashboard_off(tmp_path) -> None:
    """Ray bound the port it was given even with the dashboard off, and logged "Failed to bind
    to 127.0.0.1:8265 because it's already occupied" for a dashboard nobody asked for."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs")))
        overrides = ["cluster.include_dashboard=false", f"cluster.dashboard_port={port}"]
        done = subprocess.run(
            [sys.executable, "-c", _CONNECT, path, *overrides], cwd=REPO, env=SUBPROCESS_ENV,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0 and "connected" in done.stdout, done.stderr
    assert "Failed to bind" not in done.stderr, done.stderr
    assert str(port) not in done.stderr, done.stderr
