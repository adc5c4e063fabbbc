"""Fixtures for the bench tests: one in-process paced fake SGLang server for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rayspec.testing._fake_server import FakeBehaviour
from rayspec.testing._fake_server import FakeSGLangServer
from tests.helpers import free_port


@pytest.fixture(scope="session")
def _fake_server_session() -> Iterator[FakeSGLangServer]:
    with FakeSGLangServer() as server:
        yield server


@pytest.fixture()
def fake_server(_fake_server_session: FakeSGLangServer) -> FakeSGLangServer:
    """The shared fake server, reset to the default behaviour (tests may change it)."""
    _fake_server_session.set_behaviour(FakeBehaviour())
    return _fake_server_session


@pytest.fixture()
def closed_port_url() -> str:
    """A 127.0.0.1 URL with nothing listening."""
    return f"http://127.0.0.1:{free_port()}"
