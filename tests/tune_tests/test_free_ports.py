"""``server.port: 0`` and ``cluster.dashboard_port: 0``: the twin's quickstart on a machine where
another user holds its ports. Every port held here is one the OS gave (no fixed port is assumed
free)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.tune import _ports
from rayspec.tune._ports import free_block
from rayspec.tune._ports import with_free_ports
from tests.helpers import TWIN_EXPERIMENT


@contextlib.contextmanager
def held(n: int = 1) -> Iterator[list[int]]:
    """``n`` listening sockets on loopback ports the OS chose."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            socks.append(sock)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def test_a_held_port_is_skipped_and_a_block_needs_every_port_free() -> None:
    with held() as (port,):
        assert free_block("127.0.0.1", port, 1, key="server.port") > port
        # A block of 3 starting below the held port cannot contain it.
        start = free_block("127.0.0.1", port - 2, 3, key="server.port")
        assert not start <= port < start + 3


def test_nothing_free_in_the_span_is_one_line_naming_the_key(monkeypatch) -> None:
    monkeypatch.setattr(_ports, "_free", lambda host, port: False)
    with pytest.raises(ConfigError) as err:
        free_block("127.0.0.1", 30000, 1, key="cluster.dashboard_port")
    message = str(err.value)
    assert message.startswith("cluster.dashboard_port: 0 asks for a free port, and none of ")
    assert "cluster.dashboard_port=..." in message and "\n" not in message


def test_the_twin_experiment_takes_the_next_free_ports_and_says_so(monkeypatch, tmp_path) -> None:
    with held(2) as (server_port, dashboard_port):
        monkeypatch.setattr(_ports, "FIRST_SERVER_PORT", server_port)
        monkeypatch.setattr(_ports, "FIRST_DASHBOARD_PORT", dashboard_port)
        cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}"])
        assert cfg.server.port == 0 and cfg.cluster.dashboard_port == 0
        chosen, notes = with_free_ports(cfg)
    assert chosen.server.port not in (0, server_port)
    assert chosen.cluster.dashboard_port not in (0, dashboard_port)
    assert notes == [
        f"server.port: {server_port} is in use here, so {chosen.server.port}",
        f"cluster.dashboard_port: {dashboard_port} is in use here, so "
        f"{chosen.cluster.dashboard_port}",
    ]
    again, more = with_free_ports(chosen)  # chosen once: a named port is kept as it is
    assert again is chosen and more == []


def test_a_named_port_is_kept_even_when_taken(tmp_path) -> None:
    with held() as (port,):
        cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", f"server.port={port}"])
        chosen, notes = with_free_ports(cfg)
    assert chosen.server.port == port and notes == []  # preflight refuses it, naming the key


def test_on_a_joined_cluster_the_servers_take_the_default_port(tmp_path) -> None:
    """The nodes' ports cannot be probed from the driver: 0 is SGLang's default there."""
    cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", "cluster.address=10.0.0.1:6379"])
    chosen, notes = with_free_ports(cfg)
    assert chosen.server.port == 30000 and notes == []
