"""``python -m rayspec.twin.server``: a simulated SGLang node (the rayspec digital twin).

It takes ``sglang.launch_server``'s flags, applies SGLang's resolution rules and environment
writes, reads ``NCCL_*`` through the performance model, walks through SGLang's startup sequence
(log lines in SGLang's formats, ``/health`` answering 503 until ready), runs the warmup request
and prints ``The server is fired up and ready to roll!``. Tokens then stream at the model's rate.

Example::

    NCCL_PROTO=LL NCCL_P2P_LEVEL=SYS python -m rayspec.twin.server \\
        --model-path moonshotai/Kimi-K2.5 --tp-size 8 --port 30000 \\
        --speculative-algorithm EAGLE3 --speculative-draft-model-path drafter \\
        --speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3 \\
        --twin-profile kimi-k2.5-tp8-pcie --twin-seed 1

Exit codes, as SGLang: 2 for an argparse error (unknown or ambiguous flag); 1 for a resolution
error (traceback on stderr, before any startup log); a scheduler crash (NCCL, OOM, graph capture,
tree budget, injected faults) kills the process with SIGKILL after the failure lines, as SGLang's
``kill_process_tree`` does (``returncode == -9``). SIGTERM/SIGINT stop it cleanly (0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import re
import shlex
import signal
import socket
import sys
import time
import traceback
from typing import Any

from aiohttp import web

from rayspec.twin._adaptive import AdaptiveSteps
from rayspec.twin._app import ServerState
from rayspec.twin._app import TwinServer
from rayspec.twin._args import parse_args
from rayspec.twin._engine import Engine
from rayspec.twin._errors import NcclError
from rayspec.twin._errors import ProfileError
from rayspec.twin._log import SglangLog
from rayspec.twin._metrics import MetricsRegistry
from rayspec.twin._model import PerfModel
from rayspec.twin._nccl import NcclSetup
from rayspec.twin._nccl import resolve_nccl
from rayspec.twin._noise import NoiseModel
from rayspec.twin._profile import Profile
from rayspec.twin._profile import load_profile
from rayspec.twin._resolve import DEFAULT_CONTEXT_LEN
from rayspec.twin._resolve import Resolution
from rayspec.twin._resolve import resolve_server_args
from rayspec.twin._served import ModelFolder
from rayspec.twin._served import describe
from rayspec.twin._served import mismatches
from rayspec.twin._served import model_type
from rayspec.twin._served import read_model_folder
from rayspec.twin._text import model_seed

FAULT_KINDS = (
    "crash-startup", "crash-after", "never-ready", "stall", "oom", "graph-capture", "draft-layers",
)  # fmt: skip
DEFAULT_MAX_TOTAL_TOKENS = 131072  # UNCALIBRATED KV pool size of the twin
WARMUP_PROMPT = "The capital city of France is"
WARMUP_TOKENS = 8

GRAPH_CAPTURE_HELP = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. "
    "Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose"
)
GRAPH_CAPTURE_HELP_OLD = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose"
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
    "capacity of 94.97 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this "
    "process has 93.84 GiB memory in use. Of the allocated memory 91.20 GiB is allocated by "
    "PyTorch, and 1.31 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
WARMUP_ERROR = (
    "Initialization failed. warmup error: Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", '
    "line 2548, in _execute_server_warmup\n"
    '    assert res.status_code == 200, f"{res}"\n'
    "AssertionError: <Response [500]>"
)
INVALID_DEVICE = (
    "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)
NCCL_TORCH_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
    "NCCLUtils.cpp:77, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5"
)


@dataclasses.dataclass(frozen=True)
class Faults:
    """The ``--twin-fault`` options of one start (all off by default)."""

    crash_startup: bool = False
    crash_after: int | None = None
    never_ready: bool = False
    stall: int | None = None
    oom: str | None = None  # "torch" or "kv"
    graph_capture: bool = False
    # A drafter fed the wrong hidden-state layers: it still runs and every output is still the
    # target's (verification), but its acceptance is scaled by this factor.
    draft_layers: float | None = None

    @classmethod
    def parse(cls, values: list[str]) -> Faults:
        """Parse ``KIND[:ARG]`` items.

        Raises:
            ValueError: unknown kind or a bad argument (the message names the item).
        """
        fields: dict[str, Any] = {}
        for item in values:
            kind, _, arg = item.partition(":")
            if kind not in FAULT_KINDS:
                raise ValueError(
                    f"--twin-fault {item!r}: unknown kind; expected one of "
                    f"{', '.join(FAULT_KINDS)}"
                )
            if kind in ("crash-after", "stall"):
                if not arg.isdigit():
                    raise ValueError(f"--twin-fault {item!r}: expected {kind}:N with N >= 0")
                fields[kind.replace("-", "_")] = int(arg)
            elif kind == "draft-layers":
                try:
                    scale = float(arg)
                except ValueError:
                    scale = -1.0
                if not 0.0 < scale <= 1.0:
                    raise ValueError(
                        f"--twin-fault {item!r}: expected draft-layers:S with 0 < S <= 1 "
                        "(the acceptance scale)"
                    )
                fields["draft_layers"] = scale
            elif kind == "oom":
                if arg not in ("", "torch", "kv"):
                    raise ValueError(f"--twin-fault {item!r}: expected oom, oom:torch or oom:kv")
                fields["oom"] = arg or "torch"
            elif arg:
                raise ValueError(f"--twin-fault {item!r}: {kind} takes no argument")
            else:
                fields[kind.replace("-", "_")] = True
        return cls(**fields)

    def describe(self) -> list[str]:
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value not in (None, False):
                out.append(f.name.replace("_", "-") + ("" if value is True else f":{value}"))
        return out


def _die() -> None:
    """What SGLang's ``kill_process_tree`` does to its own process: SIGKILL."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _Startup:
    """One server start: SGLang's startup sequence, then serving until a signal."""

    def __init__(
        self,
        ns: Any,
        profile: Profile,
        resolution: Resolution,
        faults: Faults,
        argv: list[str],
        folder: ModelFolder | None = None,
    ) -> None:
        self.ns = ns
        self.profile = profile
        self.folder = folder
        self.res = resolution
        self.faults = faults
        self.argv = argv
        self.version: tuple[int, int, int] = ns.twin_version_tuple
        self.log = SglangLog(self.version, ns.tp_size, ns.log_level, ns.log_level_http)
        self.startup_s = max(0.0, float(ns.twin_startup_s))
        self.stop = asyncio.Event()
        self.server: TwinServer | None = None
        self._t0 = time.monotonic()
        self._mismatches = mismatches(profile, str(ns.model_path), int(ns.tp_size), folder)

    # ------------------------------------------------------------------ helpers

    async def _at(self, fraction: float) -> None:
        """Sleep until ``fraction`` of the simulated startup time has passed."""
        delay = self._t0 + fraction * self.startup_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _crash(self, exception_text: str, *, during_init: bool, warmup: bool = False) -> None:
        self.log.scheduler_exception(exception_text, during_init=during_init)
        if warmup:
            self.log.server(WARMUP_ERROR, logging.ERROR)
        else:
            self.log.sigquit()
        _die()

    def _nccl_lines(self, text: str) -> None:
        host = socket.gethostname()
        pid = os.getpid()
        for line in text.splitlines():
            if line.startswith("NCCL WARN") or line.startswith("NCCL INFO"):
                self.log.raw(f"{host}:{pid}:{pid} [0] {line}")

    def _nccl_exception(self, exc: NcclError) -> str:
        lines = [NCCL_TORCH_ERROR]
        lines += [ln.removeprefix("NCCL WARN ") for ln in str(exc).splitlines()]
        return "\n".join(lines)

    # ------------------------------------------------------------------ the sequence

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        ns, log, res = self.ns, self.log, self.res
        log.server(
            f"rayspec twin: simulated SGLang {ns.twin_version} node ({describe(self.profile)}; "
            f"seed {ns.twin_seed}); no GPU is used.",
            logging.WARNING,
        )
        for line in self._mismatches:  # a model or TP size the profile does not describe
            log.server(f"rayspec twin: {line}", logging.WARNING)
        alias_era = (0, 5, 18) <= self.version < (0, 5, 20)
        if alias_era and "--cuda-graph-max-bs" in self.argv:
            log.server(
                "'--cuda-graph-max-bs' is deprecated. Use '--cuda-graph-max-bs-decode' instead.",
                logging.WARNING,
            )
        for line in res.warnings:
            log.server(line, logging.WARNING)
        shown = ", ".join(f"{k}={v!r}" for k, v in res.args.items() if k != "twin_version")
        log.server(f"server_args=ServerArgs({shown})")
        os.environ.update(res.env_updates)

        # The HTTP port is bound first: /health answers 503 until the ready line.
        server = self._make_server()
        runner = web.AppRunner(
            server.make_app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await runner.setup()
        site = web.TCPSite(runner, ns.host, ns.port)
        try:
            await site.start()
        except OSError as exc:
            log.server(
                f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
                f"({ns.host!r}, {ns.port}): {exc.strerror}",
                logging.ERROR,
            )
            await runner.cleanup()
            return 1
        try:
            task = asyncio.ensure_future(self._sequence(server))
            stopper = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
            await self.stop.wait()
            task.cancel()
        finally:
            if server.has_engine:
                server.engine.close()
            await runner.cleanup()
        return 0

    def _make_server(self) -> TwinServer:
        ns = self.ns
        metrics = None
        if ns.enable_metrics:
            metrics = MetricsRegistry(
                {
                    "model_name": str(ns.served_model_name or ns.model_path),
                    "engine_type": "unified",
                    "tp_rank": "0",
                    "pp_rank": "0",
                    "moe_ep_rank": "0",
                }
            )
        twin_info = {
            "engine": "twin",
            "profile": self.profile.name,
            "seed": ns.twin_seed,
            "faults": self.faults.describe(),
            "architecture": self.profile.model.architecture,
            "simulates": describe(self.profile),
            "mismatches": list(self._mismatches),
        }
        server = TwinServer(
            None,  # the engine arrives after graph capture; 503 until then
            self.res,
            self.log,
            version=self.version,
            version_text=ns.twin_version,
            seed=model_seed(self.profile.name),
            twin_info=twin_info,
            metrics=metrics,
            launch_command=shlex.join(["python", "-m", "rayspec.twin.server", *self.argv]),
            model_type=model_type(self.profile, self.folder),
            pad_text=ns.twin_text == "pad",
        )
        self.server = server
        return server

    async def _sequence(self, server: TwinServer) -> None:
        ns, log, res, faults, profile = self.ns, self.log, self.res, self.faults, self.profile
        await self._at(0.05)
        log.scheduler("Init torch distributed begin.")
        gpus = profile.hardware.n_ranks
        if ns.tp_size * ns.pp_size > gpus:
            # SGLang starts one scheduler per rank on GPU base_gpu_id + rank; past the node's
            # GPUs, torch refuses the device (the profile's node has n_ranks of them).
            self._crash(INVALID_DEVICE, during_init=True)
            return
        try:
            nccl = resolve_nccl(dict(os.environ), profile)
        except NcclError as exc:
            self._nccl_lines(str(exc))
            self._crash(self._nccl_exception(exc), during_init=True)
            return
        self._report_nccl(nccl)
        server.twin_info.update({"nccl": nccl.describe(), "nccl_ll128_risk": nccl.ll128_risk})
        server.corrupt_outputs = nccl.ll128_risk
        log.scheduler("Init torch distributed ends. mem usage=0.76 GB")
        await self._at(0.15)
        if faults.crash_startup:
            self._crash(
                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API "
                "call, so the stacktrace below might be incorrect.",
                during_init=True,
            )
            return
        log.scheduler("Load weight begin. avail mem=93.52 GB")
        await self._at(0.45)
        log.scheduler(
            f"Load weight end. type={profile.model.architecture}, dtype=torch.bfloat16, "
            "avail mem=19.31 GB, mem usage=74.21 GB."
        )
        if faults.oom == "torch":
            self._crash(TORCH_OOM, during_init=True)
            return
        if faults.oom == "kv":
            self._crash(
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={res.args['mem_fraction_static']}",
                during_init=True,
            )
            return
        max_total = int(ns.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS)
        log.scheduler(f"KV Cache is allocated. #tokens: {max_total}, KV size: 8.59 GB")
        log.scheduler("Memory pool end. avail mem=9.86 GB")
        await self._at(0.5)
        model = PerfModel(profile, nccl, res.spec)
        graphs = bool(res.args.get("cuda_graph_decode_enabled", True))
        if graphs:
            log.scheduler(
                "Capture decode CUDA graph begin. This can take up to several "
                "minutes. avail mem=9.86 GB"
            )
        if nccl.hang:  # P2P on a broken platform: the first collective never returns
            await asyncio.Event().wait()
        try:  # the first collective of the process
            nccl.allreduce_us(profile.model.token_bytes)
        except NcclError as exc:
            self._nccl_lines(str(exc))
            self._crash(self._nccl_exception(exc), during_init=False)
            return
        if faults.graph_capture:
            new_help = self.version >= (0, 5, 18)
            help_text = GRAPH_CAPTURE_HELP if new_help else GRAPH_CAPTURE_HELP_OLD
            self._crash(
                "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
                "512.00 MiB. GPU 0 has a total capacity of 94.97 GiB of which 301.25 MiB is "
                f"free.\n{help_text}",
                during_init=True,
            )
            return
        await self._at(0.75)
        if graphs:
            log.scheduler(
                f"Capture decode CUDA graph end. elapsed={0.25 * self.startup_s:.2f} "
                "s, mem usage=1.21 GB. avail mem=8.65 GB."
            )
        if res.spec is not None:
            for kind in ("decode", "extend"):
                log.scheduler(f"Capture draft {kind} CUDA graph begin. avail mem=8.65 GB")
                log.scheduler(
                    f"Capture draft {kind} CUDA graph end. elapsed=0.01 s, "
                    "mem usage=0.12 GB. avail mem=8.53 GB."
                )
        await self._at(0.85)
        log.scheduler(
            f"max_total_num_tokens={max_total}, chunked_prefill_size="
            f"{res.args['chunked_prefill_size']}, max_prefill_tokens={ns.max_prefill_tokens}, "
            f"max_running_requests={res.max_running_requests}, context_len="
            f"{res.args['context_length']}, available_gpu_mem=8.53 GB"
        )
        engine = self._make_engine(model, max_total, server)
        server.engine = engine
        engine.start()
        await self._at(0.9)
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on http://{ns.host}:{ns.port} (Press CTRL+C to quit)")
        server.state = ServerState.WARMUP
        if faults.never_ready:
            await asyncio.Event().wait()
        if not ns.skip_server_warmup:
            log.access("127.0.0.1:0", "GET", "/model_info", 200, "OK")
            self._warming = True
            req = server.submit(WARMUP_PROMPT, len(WARMUP_PROMPT.split()), WARMUP_TOKENS)
            async for _ in engine.updates(req):
                pass
            self._warming = False
            log.access("127.0.0.1:0", "POST", "/generate", 200, "OK")
        await self._at(1.0)
        server.state = ServerState.READY
        server.ready_time = time.time()
        log.server("The server is fired up and ready to roll!")
        if faults.crash_after is not None:
            engine.set_token_limit(faults.crash_after, self._crash_after)
        elif faults.stall is not None:
            engine.set_token_limit(faults.stall, lambda: None)

    _warming = False

    def _report_nccl(self, nccl: NcclSetup) -> None:
        self._nccl_lines("\n".join(nccl.warnings))
        if nccl.ll128_risk:
            self.log.scheduler(
                "rayspec twin: NCCL_PROTO enables LL128 on a ring without NVLink: silent data "
                "corruption risk (NVIDIA/nccl PR #2053).",
                logging.WARNING,
            )

    def _make_engine(self, model: PerfModel, max_total: int, server: TwinServer) -> Engine:
        ns, res = self.ns, self.res
        noise = NoiseModel(
            self.profile.noise, random.Random(ns.twin_seed), speculative=res.spec is not None
        )
        engine = Engine(
            model,
            noise,
            self.log,
            max_running_requests=res.max_running_requests,
            version=self.version,
            seed=ns.twin_seed,
            decode_log_interval=ns.decode_log_interval,
            max_total_tokens=max_total,
            cuda_graph_max_bs=int(res.args["cuda_graph_max_bs_decode"]),
            graph_enabled=bool(res.args.get("cuda_graph_decode_enabled", True)),
            chunked_prefill_size=int(res.args["chunked_prefill_size"]),
            max_prefill_tokens=int(ns.max_prefill_tokens),
            record_step_time=os.environ.get("SGLANG_RECORD_STEP_TIME", "").lower()
            in ("1", "true"),
            realtime=ns.twin_realtime,
            metrics=server.metrics,
            on_fatal=self._on_fatal,
            adaptive=(
                AdaptiveSteps(res.spec.num_steps, res.adaptive_tiers)
                if res.spec is not None and res.adaptive_tiers is not None
                else None
            ),
        )
        if self.faults.draft_layers is not None:
            engine.accept_scale = self.faults.draft_layers
        return engine

    def _on_fatal(self, exc: BaseException) -> None:
        """The engine's first decode failed (draft tree): SGLang's crash lines, then death."""
        text = str(exc)
        if isinstance(exc, NcclError):
            self._nccl_lines(text)
            text = self._nccl_exception(exc)
        elif not re.match(r"^[\w.]+(Error|Exception):", text):
            text = f"{type(exc).__name__}: {text}"
        self.log.scheduler_exception(text)
        if self._warming:
            self.log.server(WARMUP_ERROR, logging.ERROR)
        else:
            self.log.sigquit()
        asyncio.get_running_loop().call_later(0.05, _die)

    def _crash_after(self) -> None:
        self.log.scheduler_exception(
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect."
        )
        self.log.sigquit()
        asyncio.get_running_loop().call_later(0.05, _die)


def main(argv: list[str] | None = None) -> int:
    """Run the twin server; returns the process exit code.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parse_args(argv)  # SystemExit(2) on an unknown/ambiguous flag, as SGLang
    try:
        faults = Faults.parse(ns.twin_fault)
    except ValueError as exc:
        print(f"python -m rayspec.twin.server: error: {exc}", file=sys.stderr)
        return 2
    try:
        profile = load_profile(ns.twin_profile)
    except ProfileError as exc:
        print(f"python -m rayspec.twin.server: error: --twin-profile: {exc}", file=sys.stderr)
        return 2
    # A local model folder is read as SGLang reads it: its context length (the profile's
    # timings stay the profile's; _Startup says so when the folder is another model).
    folder = read_model_folder(str(ns.model_path))
    context = folder.context_len if folder and folder.context_len else DEFAULT_CONTEXT_LEN
    try:
        resolution = resolve_server_args(
            ns, architecture=profile.model.architecture, env=dict(os.environ),
            context_len=context,
        )  # fmt: skip
    except (ValueError, AssertionError, TypeError, NotImplementedError, OSError):
        traceback.print_exc()  # SGLang: a traceback before any startup log, exit 1
        return 1
    return asyncio.run(_Startup(ns, profile, resolution, faults, argv, folder).run())


if __name__ == "__main__":
    sys.exit(main())
