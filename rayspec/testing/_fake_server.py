"""A paced fake SGLang HTTP server for client tests and client-fidelity measurements.

It speaks the parts of SGLang's API the benchmark client uses (``/generate`` with cumulative
SSE chunks and ``spec_verify_ct``, ``/v1/completions`` with usage, ``/flush_cache``,
``/get_server_info``, ``/metrics``) and emits tokens on an exact, known schedule, so the
client's measurements can be checked against ground truth. It can also stall a stream, cut
the connection, send an error chunk or answer ``/flush_cache`` with 400 (busy).

Every emission is logged with server-side ``time.perf_counter()`` stamps (CLOCK_MONOTONIC,
comparable across processes of one Linux host); ``GET /fake/log`` returns the log and
``DELETE /fake/log`` clears it.

Run it in-process on a thread (:class:`FakeSGLangServer`) or as a process:
``python -m rayspec.testing._fake_server --port 0 --gap-ms 10`` prints ``PORT <n>`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import threading
import time
from typing import Any

from aiohttp import web

_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "ignore_eos",
        "stop",
        "stop_token_ids",
        "min_new_tokens",
        "n",
        "skip_special_tokens",
        "no_stop_trim",
        "stream_interval",
        "sampling_seed",
    }
)


@dataclasses.dataclass
class FakeBehaviour:
    """How the fake server answers the next requests.

    The first chunk (one token) is sent ``ttft_s`` after the request arrives; chunk ``i >= 1``
    is due at ``ttft_s + i * gap_s`` and adds ``pattern[(i - 1) % len(pattern)]`` tokens
    (truncated at ``max_new_tokens``). With ``spec`` the final chunk carries
    ``spec_verify_ct`` = the number of chunks after the first.

    ``stall_after_chunks``: after that many chunks, sleep ``stall_s`` before continuing.
    ``cut_after_chunks``: after that many chunks, abort the TCP connection.
    ``error_after_chunks``: after that many chunks, send ``data: {"error": ...}`` and stop.
    ``flush_busy``: answer this many ``/flush_cache`` calls with 400 first.
    ``prompt_tokens``: reported ``prompt_tokens`` (default: words of the prompt).
    ``status``: answer generation requests with this HTTP status and a JSON error instead.
    ``garbage_after_chunks``: after that many chunks, send a malformed chunk and stop.
    ``hang_after_done_s``: keep the response open this long after ``data: [DONE]``.
    """

    ttft_s: float = 0.02
    gap_s: float = 0.01
    pattern: tuple[int, ...] = (1,)
    spec: bool = True
    stall_after_chunks: int | None = None
    stall_s: float = 5.0
    cut_after_chunks: int | None = None
    error_after_chunks: int | None = None
    flush_busy: int = 0
    prompt_tokens: int | None = None
    status: int = 200
    garbage_after_chunks: int | None = None
    hang_after_done_s: float = 0.0


@dataclasses.dataclass
class Emission:
    """Server-side ground truth of one request (perf_counter seconds)."""

    endpoint: str
    recv_s: float
    prompt: str
    max_new_tokens: int
    emit_s: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)  # cumulative after each chunk
    done: bool = False
    peer_port: int = 0  # the client's source port: equal ports = one reused connection


def _peer_port(request: web.Request) -> int:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return int(peer[1]) if peer else 0


class _App:
    def __init__(self, behaviour: FakeBehaviour) -> None:
        self.behaviour = behaviour
        self.log: list[Emission] = []
        self.flush_calls = 0
        self._busy_left = behaviour.flush_busy
        self.app = web.Application()
        self.app.router.add_post("/generate", self.generate)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_route("*", "/flush_cache", self.flush_cache)
        self.app.router.add_get("/get_server_info", self.server_info)
        self.app.router.add_get("/server_info", self.server_info)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/fake/log", self.get_log)
        self.app.router.add_delete("/fake/log", self.clear_log)

    def set_behaviour(self, behaviour: FakeBehaviour) -> None:
        self.behaviour = behaviour
        self._busy_left = behaviour.flush_busy

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.flush_calls += 1
        if self._busy_left > 0:
            self._busy_left -= 1
            return web.Response(
                status=400, text="Cache not flushed because there are pending requests."
            )
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")

    def _accept_length(self) -> float | None:
        toks = sum(e.tokens[-1] for e in self.log if e.done and e.tokens)
        cycles = sum(len(e.tokens) - 1 for e in self.log if e.done and e.tokens)
        return toks / cycles if cycles else None

    async def server_info(self, request: web.Request) -> web.Response:
        state: dict[str, Any] = {"last_gen_throughput": 123.4}
        acc = self._accept_length()
        if self.behaviour.spec and acc is not None:
            state["avg_spec_accept_length"] = acc
        return web.json_response({"version": "fake", "internal_states": [state]})

    async def metrics(self, request: web.Request) -> web.Response:
        labels = 'model_name="fake",engine_type="unified",tp_rank="0",pp_rank="0"'
        acc = self._accept_length() or 0.0
        text = (
            "# HELP sglang:spec_accept_length The average acceptance length.\n"
            "# TYPE sglang:spec_accept_length gauge\n"
            f"sglang:spec_accept_length{{{labels}}} {acc}\n"
            "# TYPE sglang:gen_throughput gauge\n"
            f"sglang:gen_throughput{{{labels}}} 123.4\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} 0.0\n"
            "# TYPE sglang:generation_tokens_total counter\n"
            f"sglang:generation_tokens_total{{{labels}}} 42.0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def get_log(self, request: web.Request) -> web.Response:
        return web.json_response([dataclasses.asdict(e) for e in self.log])

    async def clear_log(self, request: web.Request) -> web.Response:
        self.log = []
        return web.Response(text="cleared")

    def _schedule(self, max_new: int) -> list[int]:
        """Tokens added by each chunk."""
        b = self.behaviour
        out = [1]
        total = 1
        i = 0
        while total < max_new:
            n = min(b.pattern[i % len(b.pattern)], max_new - total)
            out.append(n)
            total += n
            i += 1
        return out

    async def _paced(
        self, request: web.Request, em: Emission, chunk_fn: Any, final_fn: Any
    ) -> web.StreamResponse:
        b = self.behaviour
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sched = self._schedule(em.max_new_tokens)
        total = 0
        for i, n in enumerate(sched):
            due = em.recv_s + b.ttft_s + i * b.gap_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if b.cut_after_chunks is not None and i == b.cut_after_chunks:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            if b.error_after_chunks is not None and i == b.error_after_chunks:
                await resp.write(b'data: {"error": {"message": "fake failure", "code": 500}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if b.garbage_after_chunks is not None and i == b.garbage_after_chunks:
                await resp.write(b'data: {"meta_info": [1, 2], "choices": 3}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if b.stall_after_chunks is not None and i == b.stall_after_chunks:
                await asyncio.sleep(b.stall_s)
            total += n
            last = i == len(sched) - 1
            data = chunk_fn(total, n, last, len(sched) - 1)
            sent = time.perf_counter()  # stamped before the write: a client never sees it earlier
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError):
                return resp
            em.emit_s.append(sent)
            em.tokens.append(total)
        try:
            for data in final_fn(total):
                await resp.write(data)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, RuntimeError):
            return resp
        em.done = True
        if b.hang_after_done_s > 0:
            await asyncio.sleep(b.hang_after_done_s)
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        recv = time.perf_counter()
        body = await request.json()
        sp = body.get("sampling_params") or {}
        unknown = set(sp) - _SAMPLING_KEYS
        if unknown:
            return web.json_response(
                {"error": {"message": f"unknown field {sorted(unknown)}"}}, status=400
            )
        if self.behaviour.status != 200:
            return web.json_response(
                {"error": {"message": "fake status"}}, status=self.behaviour.status
            )
        prompt = body.get("text") or ""
        max_new = int(sp.get("max_new_tokens", 128))
        em = Emission("generate", recv, prompt, max_new, peer_port=_peer_port(request))
        self.log.append(em)
        b = self.behaviour
        ptoks = b.prompt_tokens if b.prompt_tokens is not None else len(prompt.split())
        if not body.get("stream"):
            await asyncio.sleep(b.ttft_s)
            em.emit_s.append(time.perf_counter())
            em.tokens.append(max_new)
            em.done = True
            return web.json_response(
                {
                    "text": "x " * max_new,
                    "output_ids": list(range(max_new)),
                    "meta_info": {
                        "prompt_tokens": ptoks,
                        "completion_tokens": max_new,
                        "finish_reason": {"type": "length", "length": max_new},
                    },
                }
            )
        text_parts: list[str] = []
        ids: list[str] = []

        def chunk(total: int, n: int, last: bool, cycles: int) -> bytes:
            start = len(ids)
            ids.extend(str(1000 + k) for k in range(start, total))
            text_parts.extend(" tok" for _ in range(n))
            meta: dict[str, Any] = {
                "id": "fake",
                "finish_reason": {"type": "length", "length": max_new} if last else None,
                "prompt_tokens": ptoks,
                "completion_tokens": total,
                "cached_tokens": 0,
            }
            if last:
                meta["e2e_latency"] = time.perf_counter() - recv
                if b.spec and cycles > 0:
                    meta["spec_verify_ct"] = cycles
                    meta["spec_accept_length"] = total / cycles
            return (
                b'data: {"text":"'
                + "".join(text_parts).encode()
                + b'","output_ids":['
                + ",".join(ids).encode()
                + b'],"meta_info":'
                + json.dumps(meta).encode()
                + b"}\n\n"
            )

        return await self._paced(request, em, chunk, lambda total: ())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        recv = time.perf_counter()
        body = await request.json()
        if self.behaviour.status != 200:
            return web.json_response(
                {"error": {"message": "fake status"}}, status=self.behaviour.status
            )
        prompt = body.get("prompt") or ""
        max_new = int(body.get("max_tokens", 16))
        em = Emission("completions", recv, prompt, max_new, peer_port=_peer_port(request))
        self.log.append(em)
        b = self.behaviour
        ptoks = b.prompt_tokens if b.prompt_tokens is not None else len(prompt.split())
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))

        def usage(total: int) -> dict[str, int]:
            return {
                "prompt_tokens": ptoks,
                "completion_tokens": total,
                "total_tokens": ptoks + total,
            }

        def chunk(total: int, n: int, last: bool, cycles: int) -> bytes:
            obj: dict[str, Any] = {
                "id": "fake",
                "object": "text_completion",
                "model": "fake",
                "choices": [
                    {"index": 0, "text": " tok" * n, "finish_reason": "length" if last else None}
                ],
            }
            if continuous:
                obj["usage"] = usage(total)
            if last and b.spec and cycles > 0 and body.get("return_spec_tokens_details"):
                obj["sglext"] = {
                    "spec_tokens_details": {
                        "spec_verify_ct": cycles,
                        "spec_accept_length": total / cycles,
                    }
                }
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def final(total: int) -> list[bytes]:
            obj = {"id": "fake", "object": "text_completion", "choices": [], "usage": usage(total)}
            return [b"data: " + json.dumps(obj).encode() + b"\n\n"]

        return await self._paced(request, em, chunk, final)


class FakeSGLangServer:
    """The fake server on a background thread of this process, on a free 127.0.0.1 port.

    Example:
        >>> with FakeSGLangServer(FakeBehaviour(gap_s=0.001)) as srv:  # doctest: +SKIP
        ...     srv.base_url
        'http://127.0.0.1:...'
    """

    def __init__(self, behaviour: FakeBehaviour | None = None) -> None:
        self._app = _App(behaviour or FakeBehaviour())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> list[Emission]:
        return self._app.log

    @property
    def flush_calls(self) -> int:
        return self._app.flush_calls

    def set_behaviour(self, behaviour: FakeBehaviour) -> None:
        """Replace the behaviour (and clear the log) before the next requests."""

        async def apply() -> None:
            self._app.set_behaviour(behaviour)
            self._app.log = []
            self._app.flush_calls = 0

        asyncio.run_coroutine_threadsafe(apply(), self._loop).result(10)

    def start(self) -> FakeSGLangServer:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> int:
        self._runner = web.AppRunner(self._app.app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeSGLangServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--pattern", default="1", help="tokens per chunk, e.g. 2,1,3")
    args = parser.parse_args(argv)
    behaviour = FakeBehaviour(
        ttft_s=args.ttft_ms / 1000.0,
        gap_s=args.gap_ms / 1000.0,
        pattern=tuple(int(x) for x in args.pattern.split(",")),
    )
    app = _App(behaviour)

    async def serve() -> None:
        runner = web.AppRunner(app.app, handle_signals=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
        await site.start()
        print(f"PORT {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
