"""The twin's HTTP side in this process: the server ``python -m rayspec.twin.server`` builds
(the same parser, resolution, ``_Startup``'s server and engine), served by aiohttp's test
server on this event loop, without the startup sequence or a process. A probe task on the same
loop measures how long the loop was kept from running (``LagProbe``), which is what a blocked
twin costs every other stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import threading
import time
from collections.abc import AsyncIterator
from collections.abc import Sequence

from aiohttp.test_utils import TestClient
from aiohttp.test_utils import TestServer

from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl
from rayspec.twin._app import ServerState
from rayspec.twin._app import TwinServer
from rayspec.twin._args import parse_args
from rayspec.twin._log import SglangLog
from rayspec.twin._model import PerfModel
from rayspec.twin._resolve import DEFAULT_CONTEXT_LEN
from rayspec.twin._resolve import resolve_server_args
from rayspec.twin._served import read_model_folder
from rayspec.twin.server import DEFAULT_MAX_TOTAL_TOKENS
from rayspec.twin.server import Faults
from rayspec.twin.server import _Startup

TUNED = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}


def build(argv: Sequence[str]) -> TwinServer:
    """The server and engine of one twin start with ``argv`` (SGLang's flags and ``--twin-*``;
    ``--model-path`` added when absent), ready to serve."""
    args = list(argv)
    if "--model-path" not in args:
        args = ["--model-path", "moonshotai/Kimi-K2.5", *args]
    ns = parse_args(args)
    profile = load_profile(ns.twin_profile)
    folder = read_model_folder(str(ns.model_path))
    context = folder.context_len if folder and folder.context_len else DEFAULT_CONTEXT_LEN
    res = resolve_server_args(
        ns, architecture=profile.model.architecture, env=TUNED, context_len=context
    )
    startup = _Startup(ns, profile, res, Faults(), args, folder)
    startup.log = SglangLog(startup.version, ns.tp_size, "error", stream=io.StringIO())
    server = startup._make_server()
    model = PerfModel(profile, resolve_nccl(TUNED, profile), res.spec)
    max_total = int(ns.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS)
    server.engine = startup._make_engine(model, max_total, server)
    server.state = ServerState.READY
    return server


class LagProbe:
    """How long the event loop was kept from a task that asks to wake every ``period_s``: the
    most CPU time this thread spent between two of its wakes (a handler or the engine holding
    the loop spends it), so a busy machine that deschedules the process does not count, and
    the wall-clock lag beside it (``max_wall_s``, for the message). CPU time this thread spent
    in the garbage collector is left out: a collection walks the whole test process's heap
    (Hypothesis, tracemalloc's records), whichever callback it happens to interrupt."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.max_lag_s = 0.0
        self.max_wall_s = 0.0
        self._epoch = 0
        self._task: asyncio.Task[None] | None = None
        self._thread = 0
        self._gc_cpu_s = 0.0  # CPU seconds this thread spent in collections so far
        self._gc_began = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_began = time.thread_time()
        else:
            self._gc_cpu_s += time.thread_time() - self._gc_began

    async def _run(self) -> None:
        while True:
            epoch, cpu, wall = self._epoch, time.thread_time(), time.perf_counter()
            in_gc = self._gc_cpu_s
            await asyncio.sleep(self.period_s)
            if epoch != self._epoch:  # begun before reset(), maybe while the loop was stopped
                continue
            held = time.thread_time() - cpu - (self._gc_cpu_s - in_gc)
            self.max_lag_s = max(self.max_lag_s, held)
            self.max_wall_s = max(self.max_wall_s, time.perf_counter() - wall - self.period_s)

    def reset(self) -> None:
        """Forget what was measured; the interval under way (which may span time the loop
        did not run at all, between ``run_until_complete`` calls) is not counted."""
        self.max_lag_s = self.max_wall_s = 0.0
        self._epoch += 1

    def __enter__(self) -> LagProbe:
        self._thread = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()


@contextlib.asynccontextmanager
async def serving(argv: Sequence[str]) -> AsyncIterator[tuple[TwinServer, TestClient]]:  # type: ignore[type-arg]
    """A started engine and a client of its app (on the running loop)."""
    server = build(argv)
    server.engine.start()
    client = TestClient(TestServer(server.make_app()))
    await client.start_server()
    try:
        yield server, client
    finally:
        await client.close()
        server.engine.close()
