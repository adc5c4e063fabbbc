"""The private local Ray cluster listens on loopback only: every listening socket of every
process it starts (GCS, raylet, core workers, object manager, dashboard, dashboard agent and
its job API, metrics export, runtime env agent) is bound to 127.0.0.1 or ::1.

The cluster is started in a child process the way the driver starts it (Ray already imported,
then :func:`rayspec.tune._cluster.connect`), and the sockets are read from ``/proc``: each
listening TCP socket's inode in ``/proc/net/tcp{,6}`` matched to the ``socket:[inode]``
descriptors of the child's process tree.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

import pytest

from rayspec import RayspecError
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp"), reason="reads listening sockets from Linux's /proc"
)

# The child: Ray imported first (as the driver's modules do), then connect(); an actor and a
# task so core workers exist; "ready" and the cluster stays up until stdin closes.
_CHILD = """
import sys
import rayspec.tune._driver  # imports ray, as the driver does before it connects
import ray
from rayspec._config import load_config
from rayspec.tune._cluster import connect, disconnect

handle = connect(load_config(sys.argv[1], sys.argv[2:]))

@ray.remote(num_cpus=0)
class Held:
    def ping(self):
        return "pong"

@ray.remote(num_cpus=0)
def task():
    return 1

held = Held.remote()
assert ray.get(held.ping.remote()) == "pong" and ray.get(task.remote()) == 1
print("ready", ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
disconnect(handle)
"""


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    pid: int
    cmd: str

    def on_loopback(self) -> bool:
        ip = ipaddress.ip_address(self.host)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, a dual-stack socket bound to loopback
        return ip.is_loopback


def _parse_addr(hex_addr: str, v6: bool) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if v6:  # four host-order 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        with open(f"/proc/net/{name}", encoding="ascii") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    out[fields[9]] = _parse_addr(fields[1], v6)
    return out


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(fh.read().decode(errors="replace").split())
    except OSError:
        return "?"


def listeners_of(root: int) -> list[Listener]:
    """Every listening TCP socket held by ``root`` or a descendant."""
    inodes = _listening_inodes()
    found: list[Listener] = []
    for pid in _process_tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else ""
            if inode in inodes:
                host, port = inodes[inode]
                found.append(Listener(host, port, pid, _cmd(pid)))
    return found


def _outward_address() -> str | None:
    """This machine's address on its default route (what Ray takes as the node IP unless told
    otherwise); None without one. A UDP connect sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = str(sock.getsockname()[0])
    return None if ipaddress.ip_address(addr).is_loopback else addr


def _held_elsewhere(host: str, port: int, ours: list[Listener]) -> bool:
    """Whether a process outside the cluster's tree listens on ``host:port`` (or on all
    interfaces at that port): another Ray cluster on this machine (a second test worker's, or
    another user's) may hold its default ports, such as the dashboard agent's 52365, on the
    outward address, and its answer is not the private cluster's."""
    wildcard = {"0.0.0.0", "::"}
    held = {(x.host, x.port) for x in ours}
    return any(
        p == port and (h == host or h in wildcard) and (h, p) not in held
        for h, p in _listening_inodes().values()
    )


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except OSError:
        return True


def test_private_cluster_listens_on_loopback_only(tmp_path) -> None:
    overrides = [
        f"output.dir={tmp_path}",
        f"cluster.dashboard_port={free_port()}",
        "cluster.include_dashboard=true",  # the default; the dashboard and its agent listen
    ]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)  # as a user's shell has it: rayspec's own choice applies
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, TWIN_EXPERIMENT, *overrides],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = child.stdout.readline()
        assert ready.startswith("ready"), child.communicate(timeout=60)[1][-3000:]
        found = listeners_of(child.pid)
        outward = _outward_address()
        answering = [
            f"{outward}:{x.port}"
            for x in found
            if outward is not None
            and not _refused(outward, x.port)
            and not _held_elsewhere(outward, x.port, found)
        ]
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=60)
    assert child.returncode == 0, child.stderr.read()[-3000:] if child.stderr else ""
    # The listeners of each of Ray's parts were seen (so the check below covers them): the
    # driver's core worker, the actor's, the GCS, raylet (node and object manager), the
    # dashboard, its agent (gRPC, HTTP job API, metrics export), the runtime env agent.
    parts = ("import rayspec.tune._driver", "ray::Held", "gcs_server", "raylet", "dashboard.py",
             "ray::DashboardAgent", "ray::RuntimeEnvAgent")  # fmt: skip
    for part in parts:
        assert any(part in x.cmd for x in found), f"no listener of {part!r} found"
    outside = [f"{x.host}:{x.port} ({x.cmd[:100]})" for x in found if not x.on_loopback()]
    assert not outside, f"{len(outside)} of {len(found)} beyond loopback:\n" + "\n".join(outside)
    assert not answering, f"answer on {outward}: {answering}"


class _Stop(Exception):
    pass


def _seen_by_init(monkeypatch, overrides: list[str], tmp_path) -> dict[str, object]:
    """What ray.init would see (auth mode, the single-node switch): a stand-in records it and
    stops connect() there."""
    import ray
    import ray._private.ray_constants as ray_constants

    from rayspec._config import load_config
    from rayspec.tune._cluster import connect

    seen: dict[str, object] = {}

    def fake_init(*args: object, **kwargs: object) -> None:
        seen.update(
            auth=os.environ.get("RAY_AUTH_MODE"),
            single_node=not ray_constants.ENABLE_RAY_CLUSTER,
            switch=os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
            kwargs=kwargs,
        )
        raise _Stop

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.setattr(ray, "init", fake_init)
    # connect() shuts Ray down on any exception: the stand-in's stop must not end the session's
    # cluster (a later test in this process would auto-start one with no GPUs and wait forever).
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    before = ray_constants.ENABLE_RAY_CLUSTER
    cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *overrides])
    with pytest.raises(_Stop):
        connect(cfg)
    assert ray_constants.ENABLE_RAY_CLUSTER == before  # restored for a later join
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    return seen


def test_the_private_cluster_starts_single_node_with_auth_off(monkeypatch, tmp_path) -> None:
    seen = _seen_by_init(monkeypatch, [], tmp_path)
    assert seen["single_node"] is True and seen["switch"] == "0"
    assert seen["auth"] == "disabled"


def test_a_dashboard_beyond_loopback_keeps_rays_token_auth(monkeypatch, tmp_path) -> None:
    seen = _seen_by_init(monkeypatch, ["cluster.dashboard_host=0.0.0.0"], tmp_path)
    assert seen["single_node"] is True  # the rest still on loopback
    assert seen["auth"] is None  # Ray's own default: a token


def test_joining_a_cluster_keeps_its_binding_and_auth(monkeypatch, tmp_path) -> None:
    seen = _seen_by_init(monkeypatch, ["cluster.address=10.0.0.1:6379"], tmp_path)
    assert seen["single_node"] is False and seen["switch"] is None
    assert seen["auth"] is None


def test_a_node_ip_beyond_loopback_with_auth_off_is_refused(monkeypatch, tmp_path) -> None:
    """Should a Ray release ignore the single-node switch, the cluster is shut down at once
    rather than left listening beyond loopback with auth off."""
    import ray

    from rayspec._config import load_config
    from rayspec.tune._cluster import connect

    calls: list[str] = []
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: calls.append("init"))
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.2")
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}"])
    with pytest.raises(RayspecError, match="node IP 192.0.2.2, not 127.0.0.1"):
        connect(cfg)
    assert calls == ["init", "shutdown"]
