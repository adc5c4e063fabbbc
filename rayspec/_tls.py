"""One TLS context per process for every HTTP client rayspec makes.

httpx builds a default SSL context for each client, loading the CA bundle each time (~20 ms of
CPU): a trial makes dozens of clients (its benchmark runs, the ready wait, the server's view),
all to loopback ``http://`` URLs that never use it. The context is built on first use and shared.
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["shared_ssl_context"]


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The process's verifying client context (as httpx's default: the system's CAs)."""
    return ssl.create_default_context()
