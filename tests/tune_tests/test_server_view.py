"""The server's own view of a trial, as real SGLang 0.5.23 reports it.

Found against the real server on a CPU (tests/real_sglang/): its ``sglang:spec_accept_length``
gauge reads 0 without speculation and before a decode-log window has completed, its
``sglang:gen_throughput`` gauge is 0 after a run (SGLang zeroes it at each prefill-stats tick and
30 s after the last decode window), and every call of ``/get_server_info`` logs a deprecation
warning (``/server_info`` is the name since 0.5.12).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import ray

from rayspec._types import LaunchSpec
from rayspec.bench import _runner
from rayspec.server._backends import SGLangBackend
from rayspec.tune._trial import _server_view


class _Remote:
    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self, *_args: Any, **_kwargs: Any) -> Any:
        return ray.put(self.value)


def _view(metrics: dict[str, float], *, speculative: bool) -> dict[str, float]:
    bench = SimpleNamespace(server_view=_Remote({"metrics": metrics}))
    server = SimpleNamespace(log_tail=_Remote(""))
    launch = LaunchSpec(
        argv=("python",), env=(), host="127.0.0.1", port=1, log_path="/nonexistent",
        startup_timeout_s=1.0, engine="sglang",
    )  # fmt: skip
    return _server_view(bench, server, launch, speculative=speculative)


def test_no_accept_length_without_speculation(ray_cluster) -> None:
    view = _view(
        {"sglang:spec_accept_length": 0.0, "sglang:gen_throughput": 0.0}, speculative=False
    )
    assert "metrics_spec_accept_length" not in view
    assert "metrics_gen_throughput" not in view  # 0 after a run: no decode window, not 0 tok/s


def test_no_accept_length_before_a_decode_log_window(ray_cluster) -> None:
    # The always-agreeing pair, 3 x 32 tokens at accept length 2.9: 33 verify steps, fewer than
    # SGLang's 40-step decode-log window, and the gauge still read 0.
    view = _view({"sglang:spec_accept_length": 0.0}, speculative=True)
    assert "metrics_spec_accept_length" not in view


def test_the_gauges_of_a_speculative_trial(ray_cluster) -> None:
    view = _view(
        {"sglang:spec_accept_length": 2.9, "sglang:gen_throughput": 41.5}, speculative=True
    )
    assert view["metrics_spec_accept_length"] == 2.9
    assert view["metrics_gen_throughput"] == 41.5


def _recording(paths: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path in ("/server_info", "/get_server_info"):
            return httpx.Response(200, json={"version": "0.5.23", "internal_states": [{}]})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def test_the_backend_asks_server_info_by_its_current_name() -> None:
    paths: list[str] = []
    with httpx.Client(base_url="http://server", transport=_recording(paths)) as client:
        info = SGLangBackend()._server_info(client)
    assert info["version"] == "0.5.23"
    assert paths == ["/server_info"]


def test_the_bench_asks_server_info_by_its_current_name(monkeypatch) -> None:
    paths: list[str] = []
    real = httpx.AsyncClient

    def client(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
        return real(*args, transport=_recording(paths), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    view = asyncio.run(_runner.afetch_server_view("http://server"))
    assert view["server_info"]["version"] == "0.5.23"
    assert paths[0] == "/server_info" and "/get_server_info" not in paths
