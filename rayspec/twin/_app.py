"""SGLang's HTTP API for the twin (``docs/sglang.md``, *HTTP API*), on aiohttp.

Shapes follow SGLang 0.5.23: ``/generate`` with cumulative SSE chunks and ``meta_info``; the
OpenAI ``/v1/completions`` and ``/v1/chat/completions`` streams with an optional usage chunk;
``/server_info`` with the resolved arguments and ``internal_states``; ``/flush_cache`` (400 when
busy); ``/metrics`` under ``--enable-metrics``. Version gates: ``/server_info`` and
``/model_info`` from 0.5.12, ``/ready`` from 0.5.20, HTTP 400 for unknown ``sampling_params``
keys from 0.5.22.

Ends as SGLang ends them: the token budget (``finish_reason`` ``length``), the model's
end-of-sequence token unless ``ignore_eos`` (``stop``; the twin's answers run at least 512
tokens, so short requests get their whole budget), a ``stop`` string or a ``stop_token_ids``
token (``stop``, with ``matched``), none of them before ``min_new_tokens``. The benchmark client
always sends ``ignore_eos``. ``/tokenize`` and ``/detokenize`` use the twin's words (one token
per word). ``cached_tokens`` is always 0 (no prefix cache).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from rayspec.twin._engine import Engine
from rayspec.twin._engine import EngineDead
from rayspec.twin._engine import GenRequest
from rayspec.twin._log import SglangLog
from rayspec.twin._metrics import MetricsRegistry
from rayspec.twin._resolve import Resolution
from rayspec.twin._text import EOS_TOKEN_ID
from rayspec.twin._text import TOKEN_ID_OFFSET
from rayspec.twin._text import WORDS
from rayspec.twin._text import completion_ids
from rayspec.twin._text import corrupt_ids
from rayspec.twin._text import count_prompt_tokens
from rayspec.twin._text import delta_text
from rayspec.twin._text import detokenize
from rayspec.twin._text import encode
from rayspec.twin._text import eos_position

SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
FLUSH_BUSY = (
    "Cache not flushed.\nPlease check backend logs for more details. (When there are running "
    "or waiting requests, the operation will not be performed.)\n"
)
# The twin's own resolved values, not SGLang server arguments: left out of /server_info.
_TWIN_ARGS = frozenset({"twin_version", "cuda_graph_decode_enabled"})
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class ServerState:
    """Lifecycle of one twin start: LOADING -> WARMUP -> READY (or stays, on a fault)."""

    LOADING = "loading"
    WARMUP = "warmup"
    READY = "ready"


@dataclasses.dataclass(frozen=True)
class Stops:
    """What ends a request before its budget: SGLang's ``stop``, ``stop_token_ids``,
    ``ignore_eos``, ``min_new_tokens`` and ``no_stop_trim`` sampling parameters."""

    strings: tuple[str, ...] = ()
    token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    no_stop_trim: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Stops:
        """From ``sampling_params`` (or an OpenAI body: the same names, ``min_tokens``)."""
        stop = params.get("stop")
        strings = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or ())
        min_new = params.get("min_new_tokens", params.get("min_tokens")) or 0
        return cls(
            strings=tuple(s for s in strings if s),
            token_ids=frozenset(int(t) for t in params.get("stop_token_ids") or ()),
            ignore_eos=bool(params.get("ignore_eos")),
            min_new_tokens=max(0, int(min_new)),
            no_stop_trim=bool(params.get("no_stop_trim")),
        )


@dataclasses.dataclass(frozen=True)
class _End:
    """How a request ends, decided when it is submitted (the twin's text is known ahead)."""

    finish: dict[str, Any]  # SGLang's meta_info finish_reason
    trim_at: int | None = None  # the final text is cut here (a matched stop string)
    drop_last: bool = False  # the matched stop token has no text


def plan_end(ids: list[int], eos_at: int, max_new_tokens: int, stops: Stops) -> tuple[int, _End]:
    """How many tokens a request generates, and how it ends.

    Args:
        ids: the completion's token ids: ``max_new_tokens`` of them, or up to the
            end-of-sequence token where the request can end there.
        eos_at: the position (1-based) of the model's end-of-sequence token.
        max_new_tokens: the budget.
        stops: the request's stop conditions (none is checked before ``min_new_tokens``).
    """
    eos = not stops.ignore_eos and stops.min_new_tokens < eos_at <= max_new_tokens
    limit = eos_at - 1 if eos else max_new_tokens  # tokens with text before the end
    if stops.token_ids or stops.strings:
        longest = max((len(s) for s in stops.strings), default=0)
        text = ""
        for n in range(1, limit + 1):
            token = ids[n - 1]
            start = max(0, len(text) - longest + 1)
            word = WORDS[(token - TOKEN_ID_OFFSET) % len(WORDS)]
            text = f"{text} {word}" if text else word
            if n <= stops.min_new_tokens:
                continue
            if token in stops.token_ids:
                finish = {"type": "stop", "matched": token}
                return n, _End(finish, drop_last=not stops.no_stop_trim)
            hits = [(text.find(s, start), s) for s in stops.strings if s in text[start:]]
            if hits:
                at, matched = min(hits)
                finish = {"type": "stop", "matched": matched}
                return n, _End(finish, trim_at=None if stops.no_stop_trim else at)
    if eos:  # the EOS token itself is generated (and counted), and has no text
        return eos_at, _End({"type": "stop", "matched": EOS_TOKEN_ID})
    return max_new_tokens, _End({"type": "length", "length": max_new_tokens})


def _max_new_tokens(params: Mapping[str, Any], unlimited: Callable[[], int]) -> int:
    """``sampling_params.max_new_tokens``: 128 when absent, ``unlimited()`` when null."""
    value = params.get("max_new_tokens", 128)
    return unlimited() if value is None else int(value)


def _category(body: Mapping[str, Any]) -> str | None:
    """The twin's own top-level ``rayspec_category`` (the prompt's category, sent by
    rayspec's client to the twin only; SGLang ignores unknown top-level keys)."""
    value = body.get("rayspec_category")
    return value if isinstance(value, str) and value else None


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    body = {
        "object": "error",
        "message": message,
        "type": "BadRequest",
        "param": None,
        "code": status,
    }
    return web.json_response(body, status=status)


class TwinServer:
    """The HTTP side of one twin start.

    Args:
        engine: the scheduler.
        resolution: the resolved server arguments.
        log: SGLang-format log.
        version: emulated SGLang version.
        version_text: the version string reported in ``/server_info``.
        seed: the seed of the greedy text (the profile's: one model, one text per prompt).
        twin_info: what ``/server_info["rayspec_twin"]`` reports (profile, seed, faults).
        metrics: the registry when ``--enable-metrics``.
        launch_command: the command line, for ``/server_info``.
    """

    def __init__(
        self,
        engine: Engine | None,
        resolution: Resolution,
        log: SglangLog,
        *,
        version: tuple[int, int, int],
        version_text: str,
        seed: int,
        twin_info: dict[str, Any],
        metrics: MetricsRegistry | None,
        launch_command: str,
    ) -> None:
        self._engine = engine
        self.resolution = resolution
        self.args = resolution.args
        self.log = log
        self.version = version
        self.version_text = version_text
        self.seed = seed
        self.corrupt_outputs = False  # set when the NCCL setup corrupts data (LL128 on PCIe)
        self.twin_info = twin_info
        self.metrics = metrics
        self.launch_command = launch_command
        self.state = ServerState.LOADING
        self.startup_time = time.time()
        self.ready_time = self.startup_time  # set when the server is ready
        self.model_name = str(self.args.get("served_model_name") or self.args["model_path"])
        self.health_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.on_request_start: Callable[[], None] | None = None
        self._ends: dict[int, _End] = {}  # engine request index -> how it ends

    @property
    def engine(self) -> Engine:
        """The scheduler (HTTP 503 while the server is still loading)."""
        if self._engine is None:
            raise web.HTTPServiceUnavailable(text="The server is starting.")
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def has_engine(self) -> bool:
        return self._engine is not None

    # ------------------------------------------------------------------ app

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log], client_max_size=64 * 1024**2)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        if self.version >= (0, 5, 20):
            r.add_get("/ready", self.ready)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/get_server_info", self.server_info)
        if self.version >= (0, 5, 12):
            r.add_get("/model_info", self.model_info)
            r.add_get("/server_info", self.server_info)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/set_internal_state", self.set_internal_state)
        r.add_route("PUT", "/set_internal_state", self.set_internal_state)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model_card)
        for path in ("/tokenize", "/v1/tokenize"):
            r.add_post(path, self.tokenize)
        for path in ("/detokenize", "/v1/detokenize"):
            r.add_post(path, self.detokenize)
        if self.metrics is not None:
            r.add_get("/metrics", self.metrics_endpoint)
        return app

    @web.middleware
    async def _access_log(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self._log_access(request, exc.status, exc.reason)
            raise
        self._log_access(request, response.status, response.reason)
        return response

    def _log_access(self, request: web.Request, status: int, reason: str) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
        self.log.access(where, request.method, request.path_qs, status, reason)

    # ------------------------------------------------------------------ status endpoints

    async def health(self, request: web.Request) -> web.Response:
        if self.state != ServerState.READY or not self.has_engine:
            return web.Response(status=503)
        if self.engine.frozen:  # a hung scheduler: no output within the health timeout
            await asyncio.sleep(self.health_timeout_s)
            return web.Response(status=503)
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        if self.state == ServerState.READY and self.has_engine and not self.engine.frozen:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready"}, status=503)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.args["model_path"],
                "served_model_name": self.model_name,
                "tokenizer_path": self.args.get("tokenizer_path") or self.args["model_path"],
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": self.args.get("load_format", "auto"),
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "kimi_k25",
                "architectures": [self.twin_info.get("architecture", "")],
            }
        )

    def _startup_phases(self) -> dict[str, Any]:
        """SGLang's ``startup_time``: seconds per startup phase (the twin's whole start is
        counted as the scheduler's)."""
        graphs = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                  "draft_extend")  # fmt: skip
        return {
            "load_weight": 0.0,
            "kv_cache_allocation": 0.0,
            "scheduler_e2e": max(0.0, self.ready_time - self.startup_time),
            "cuda_graph": dict.fromkeys(graphs, 0.0),
        }

    def server_info_dict(self) -> dict[str, Any]:
        """The ``/server_info`` body (also used by the metrics and tests)."""
        args = {k: v for k, v in self.args.items() if k not in _TWIN_ARGS}
        internal: dict[str, Any] = dict(args)
        phases = self._startup_phases()
        internal.update(
            {
                "world_size": args["tp_size"],
                "startup_time": phases,
                "effective_max_running_requests_per_dp": self.engine.cap,
                "last_gen_throughput": self.engine.stats.last_gen_throughput,
                "memory_usage": {
                    "weight": 0.0,
                    "kvcache": 0.0,
                    "startup_available": 0.0,
                    "token_capacity": self.engine.max_total_tokens,
                    "token_capacity_swa": None,
                    "graph": dict(phases["cuda_graph"]),
                },
            }
        )
        accept = self.engine.avg_spec_accept_length()
        if accept is not None:
            internal["avg_spec_accept_length"] = accept
        if self.engine.step_time_dict is not None:
            internal["step_time_dict"] = {
                k: list(v) for k, v in self.engine.step_time_dict.items()
            }
        args.update(
            {
                "launch_command": self.launch_command,
                "version": self.version_text,
                "frontend": "python",
                "startup_time": {**phases, "tokenizer_e2e": phases["scheduler_e2e"]},
                "kv_events": None,
                "internal_states": [internal],
                "rayspec_twin": self.twin_info,
            }
        )
        return args

    async def server_info(self, request: web.Request) -> web.Response:
        if request.path == "/get_server_info" and self.version >= (0, 5, 12):
            self.log.server(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future "
                "version. Please use '/server_info' instead.",
                logging.WARNING,
            )
        return web.json_response(self.server_info_dict())

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.engine.flush():
            self.log.scheduler(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {self.engine.num_waiting}, #running-req: {self.engine.num_running}",
                logging.WARNING,
            )
            return web.Response(status=400, text=FLUSH_BUSY)
        self.log.scheduler("Cache flushed successfully!")
        return web.Response(status=200, text=FLUSH_OK)

    async def set_internal_state(self, request: web.Request) -> web.Response:
        body = await request.json()
        updates = body.get("server_args", {}) if isinstance(body, dict) else {}
        allowed = {
            "pp_max_micro_batch_size",
            "speculative_accept_threshold_single",
            "speculative_accept_threshold_acc",
        }
        if any(k not in allowed and not k.startswith("dspark_") for k in updates):
            return web.json_response({"updated": False, "server_args": {}})
        self.engine.flush()
        return web.json_response({"updated": True, "server_args": updates})

    def _card(self, model: str) -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": int(self.startup_time),
            "owned_by": "sglang",
            "root": model,
            "parent": None,  # set only for a LoRA adapter's card (its base model)
            "max_model_len": self.args.get("context_length"),
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card(self.model_name)]})

    async def model_card(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{model}``: the served model's card, or OpenAI's 404."""
        model = request.match_info["model"]
        if model != self.model_name:
            return web.json_response({"error": {
                "message": f"The model '{model}' does not exist", "type": "invalid_request_error",
                "param": "model", "code": "model_not_found",
            }}, status=404)  # fmt: skip
        return web.json_response(self._card(model))

    async def tokenize(self, request: web.Request) -> web.Response:
        """``POST /tokenize`` and ``/v1/tokenize``: ``{"prompt": str | [str]}`` or
        ``{"messages": [...]}`` (the chat prompt, as ``/v1/chat/completions`` counts it) to
        ``{"tokens", "count", "max_model_len"}``, in twin tokens (one per word, as
        ``/generate`` counts a prompt)."""
        body, refused = await self._json_body(request)
        if refused is not None:
            return refused
        prompt = body.get("prompt")
        max_len = int(self.args.get("context_length") or -1)
        if body.get("messages") is not None:  # SGLang takes messages before prompt
            chat = chat_prompt(body["messages"])
            if isinstance(chat, str):
                return _error(400, chat)
            ids = encode(chat[1])
            return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": max_len})
        if isinstance(prompt, str):
            ids = encode(prompt)
            return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": max_len})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            lists = [encode(p) for p in prompt]
            return web.json_response({"tokens": lists, "count": [len(x) for x in lists],
                                      "max_model_len": max_len})  # fmt: skip
        return _error(400, f"Invalid prompt type: {type(prompt)}. Expected str or List[str].")

    async def detokenize(self, request: web.Request) -> web.Response:
        """``POST /detokenize`` and ``/v1/detokenize``: ``{"tokens": [int] | [[int]],
        "skip_special_tokens": bool}`` to ``{"text"}`` (the end-of-sequence token has text only
        with ``skip_special_tokens`` false)."""
        body, refused = await self._json_body(request)
        if refused is not None:
            return refused
        tokens = body.get("tokens")
        skip = body.get("skip_special_tokens", True)
        if not isinstance(skip, bool):
            return _error(400, "Invalid input: 'skip_special_tokens' must be a boolean.")
        if isinstance(tokens, list) and not tokens:
            return web.json_response({"text": ""})
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return web.json_response({"text": detokenize(tokens, skip_special_tokens=skip)})
        if isinstance(tokens, list) and all(
            isinstance(ts, list) and all(isinstance(t, int) for t in ts) for ts in tokens
        ):
            texts = [detokenize(ts, skip_special_tokens=skip) for ts in tokens]
            return web.json_response({"text": texts})
        return _error(400, "Invalid input: 'tokens' must be a list of integers or of lists of "
                      "integers.")  # fmt: skip

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        if self.metrics is None:  # the route is only mounted with --enable-metrics
            raise web.HTTPNotFound()
        eng = self.engine
        spec = eng.spec
        gauges: dict[str, float] = {
            "num_running_reqs": eng.num_running,
            "num_queue_reqs": eng.num_waiting,
            "num_used_tokens": eng.used_tokens,
            "token_usage": eng.used_tokens / eng.max_total_tokens,
            "gen_throughput": eng.stats.last_gen_throughput,
            "cache_hit_rate": 0.0,
            "max_total_num_tokens": eng.max_total_tokens,
            "is_cuda_graph": 1.0 if eng.graph_enabled else 0.0,
            "spec_accept_length": eng.stats.last_accept_length,
            "spec_accept_rate": eng.stats.last_accept_rate,
            # no prefix cache, no retraction, no DSpark in the twin: SGLang's series, at zero
            "context_len": float(self.args.get("context_length") or 0),
            "page_size": float(self.args.get("page_size") or 1),
            "kv_used_tokens": eng.used_tokens,
            "kv_available_tokens": eng.max_total_tokens - eng.used_tokens,
            "num_retracted_reqs": 0.0,
            "num_paused_reqs": 0.0,
            "startup_time_seconds": max(0.0, self.ready_time - self.startup_time),
        }
        counters: dict[str, float] = {
            "prompt_tokens_total": eng.stats.prompt_tokens,
            "generation_tokens_total": eng.stats.generated_tokens,
            "num_requests_total": eng.stats.requests,
            "cached_tokens_total": 0.0,
        }
        if self.version >= (0, 5, 18):
            gauges["spec_num_steps"] = spec.num_steps if spec else 0
            gauges["spec_num_draft_tokens"] = spec.num_draft_tokens if spec else 0
            gauges["spec_cap_length"] = 0.0
            gauges["spec_block_accept_length"] = 0.0
            if spec is not None:  # SGLang registers the verify counter with speculation only
                counters["spec_verify_calls_total"] = eng.stats.verify_calls
        text = self.metrics.render(gauges, counters)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # ------------------------------------------------------------------ generation core

    def _check_serving(self) -> web.Response | None:
        if self.state == ServerState.LOADING or not self.has_engine:
            return web.Response(status=503, text="The server is starting.")
        return None

    def submit(
        self,
        prompt_key: str,
        prompt_tokens: int,
        max_new_tokens: int,
        rid: str | None = None,
        stops: Stops | None = None,
        category: str | None = None,
    ) -> GenRequest:
        """Queue one generation in the engine (also used for the warmup request).

        Its end (budget, end-of-sequence, a stop string or token) is decided here: the twin's
        text is known ahead, so the engine generates exactly the tokens up to it.
        """
        if self.on_request_start is not None:
            self.on_request_start()
        budget = max(0, max_new_tokens)
        stops = stops or Stops()
        eos_at = eos_position(self.seed, prompt_key)
        # The tokens past end-of-sequence are never generated: a budget without limit (up to
        # the context length) costs no more than the answer.
        ends_at_eos = not stops.ignore_eos and stops.min_new_tokens < eos_at
        needed = min(budget, eos_at) if ends_at_eos else budget
        ids = completion_ids(self.seed, prompt_key, needed)
        if self.corrupt_outputs:
            ids = corrupt_ids(ids, prompt_key)
        n, end = plan_end(ids, eos_at, budget, stops)
        ended_by_eos = end.finish["type"] == "stop" and end.finish["matched"] == EOS_TOKEN_ID
        ids = ids[: n - 1] + [EOS_TOKEN_ID] if ended_by_eos else ids[:n]
        req = self.engine.submit(
            rid=rid or uuid.uuid4().hex,
            prompt_tokens=prompt_tokens,
            max_new_tokens=n,
            output_ids=ids,
            category=category,
        )
        self._ends[req.index] = end
        while len(self._ends) > 4096:  # ends of requests long served
            del self._ends[next(iter(self._ends))]
        return req

    def _finish(self, req: GenRequest) -> dict[str, Any]:
        """The finish_reason of a finished request (``meta_info``'s form)."""
        if req.aborted:
            return {"type": "abort", "message": "aborted"}
        end = self._ends.get(req.index)
        return end.finish if end is not None else {"type": "length", "length": req.max_new_tokens}

    def text_of(self, req: GenRequest, final: bool) -> str:
        """The request's text so far; the final text without a matched stop string or token
        (unless ``no_stop_trim``)."""
        ids = req.output_so_far
        end = self._ends.get(req.index) if final else None
        if end is not None and end.drop_last:
            ids = ids[:-1]
        text = detokenize(ids)
        if end is not None and end.trim_at is not None:
            text = text[: end.trim_at]
        return text

    def meta_info(
        self, req: GenRequest, final: bool, *, first: bool = False, stream: bool = False
    ) -> dict[str, Any]:
        """A ``/generate`` answer's ``meta_info`` (``first``: the first chunk of a stream).

        SGLang 0.5.23's fields: the scheduler's timings with ``--enable-metrics``, the time
        the answer was first sent (a stream's first chunk; the final one with metrics or
        without streaming), and on the final chunk the end-to-end latency, the weight
        versions and the speculative fields. Plus the twin's own ``rayspec_twin`` object (the
        simulated clock, see :mod:`rayspec.twin._engine`).
        """
        metrics = self.metrics is not None
        unix = time.time() - time.monotonic()  # engine times are monotonic
        first_token = req.first_token_s if req.first_token_s is not None else req.arrival_s
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": self._finish(req) if final else None,
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if metrics:
            meta.update(
                {
                    "storage_prefetch_wait": 0.0,
                    "storage_staging_wait": 0.0,
                    "forward_entry_time": unix + req.arrival_s,
                    "prefill_finished_time": unix + first_token,
                    "queue_time": 0.0,
                }
            )
        meta.update(
            {"reasoning_tokens": 0, "completion_tokens": req.output_tokens, "cached_tokens": 0}
        )
        if final:
            meta["weight_versions"] = _weight_versions(req.output_tokens)
        meta["cached_tokens_details"] = {"device": 0, "host": 0}
        meta["dp_rank"] = None
        if first or (final and (metrics or not stream)):
            meta["response_sent_to_client_ts"] = unix + first_token
        # Twin-only (SGLang has no such field; clients ignore unknown keys): the request's
        # arrival and its latest tokens on the engine's simulated clock, in seconds since the
        # start, free of the host's scheduling jitter (rayspec's client reads them on the twin).
        meta["rayspec_twin"] = {"sim_arrival_s": req.sim_arrival_s, "sim_token_s": req.sim_token_s}
        if final:
            end = req.finished_s if req.finished_s is not None else time.monotonic()
            meta["e2e_latency"] = end - req.arrival_s
            meta.update(req.meta_spec(self.engine.spec, self.version))
            if metrics:
                decode_s = end - first_token
                meta.update(
                    {
                        "request_received_ts": unix + req.arrival_s,
                        "first_token_latency": first_token - req.arrival_s,
                        "api_server_dispatch_finish_ts": unix + req.arrival_s,
                        "request_finished_ts": unix + end,
                    }
                )
                if req.output_tokens > 1 and decode_s > 0:
                    meta["decode_throughput"] = (req.output_tokens - 1) / decode_s
        return meta

    async def _run_to_end(self, req: GenRequest) -> None:
        async for _ in self.engine.updates(req):
            pass

    async def _merged_updates(
        self, reqs: list[GenRequest]
    ) -> AsyncIterator[tuple[int, GenRequest]]:
        """(index, request) each time one of ``reqs`` got tokens, until all finish."""
        if len(reqs) == 1:
            async for _ in self.engine.updates(reqs[0]):
                yield 0, reqs[0]
            return
        queue: asyncio.Queue[tuple[int, GenRequest] | BaseException | None] = asyncio.Queue()

        async def pump(i: int, req: GenRequest) -> None:
            try:
                async for _ in self.engine.updates(req):
                    queue.put_nowait((i, req))
            except BaseException as exc:  # forwarded to the consumer, re-raised there
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(None)

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(reqs)]
        done = 0
        try:
            while done < len(reqs):
                item = await queue.get()
                if item is None:
                    done += 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()

    def _abort_all(self, reqs: list[GenRequest]) -> None:
        for req in reqs:
            self.engine.abort(req)

    async def _json_body(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """The request's JSON object, or the response refusing it (not serving, bad JSON)."""
        blocked = self._check_serving()
        if blocked is not None:
            return {}, blocked
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return {}, _error(400, f"Invalid JSON: {exc}")
        if not isinstance(body, dict):
            return {}, _error(400, "The request body must be a JSON object.")
        return body, None

    # ------------------------------------------------------------------ /generate

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._json_body(request)
        if refused is not None:
            return refused
        text: Any = body.get("text")
        input_ids: Any = body.get("input_ids")
        if text is None and not isinstance(input_ids, list):
            return _error(400, "Either text or input_ids should be provided.")
        if text is not None:
            prompts = text if isinstance(text, list) else [text]
            keys = [str(t) for t in prompts]
            counts = [count_prompt_tokens(str(t)) for t in prompts]
        else:
            batch_ids = input_ids if input_ids and isinstance(input_ids[0], list) else [input_ids]
            keys = [json.dumps(ids) for ids in batch_ids]
            counts = [max(1, len(ids)) for ids in batch_ids]
        is_batch = isinstance(text, list) or (
            text is None and bool(input_ids) and isinstance(input_ids[0], list)
        )
        sp = body.get("sampling_params") or {}
        sps = sp if isinstance(sp, list) else [sp] * len(keys)
        for one in sps:
            unknown = sorted(set(one) - SAMPLING_KEYS)
            if unknown and self.version >= (0, 5, 22):
                return _error(400, f"unknown field `{unknown[0]}` in sampling_params")
        try:
            stops = [Stops.from_params(one) for one in sps]
        except (TypeError, ValueError) as exc:
            return _error(400, f"invalid stop condition in sampling_params: {exc}")
        rid = body.get("rid")
        rids = rid if isinstance(rid, list) else [rid] * len(keys)
        category = _category(body)
        reqs = [
            self.submit(
                key,
                n,
                _max_new_tokens(one, functools.partial(self._unlimited_budget, n)),
                rid=(r if len(keys) == 1 else None) or None,
                stops=stop,
                category=category,
            )
            for key, n, one, r, stop in zip(keys, counts, sps, rids, stops, strict=False)
        ]
        if not body.get("stream"):
            try:
                await asyncio.gather(*(self._run_to_end(r) for r in reqs))
            except EngineDead:
                return await self._die_forever()
            except (asyncio.CancelledError, ConnectionError):
                self._abort_all(reqs)
                raise
            outs = [self._generate_obj(r, final=True) for r in reqs]
            return web.json_response(outs if is_batch else outs[0])
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        interval = max(1, int(self.args.get("stream_interval") or 1))
        emitted = [0] * len(reqs)
        sent = [0] * len(reqs)
        try:
            async for i, req in self._merged_updates(reqs):
                emitted[i] += 1
                if not req.finished and emitted[i] % interval:
                    continue
                obj = self._generate_obj(
                    req, final=req.finished, since=sent[i], first=not sent[i], stream=True
                )
                sent[i] = req.output_tokens
                if is_batch:
                    obj["index"] = i
                await resp.write(_sse(obj))
            await resp.write(b"data: [DONE]\n\n")
        except EngineDead:
            return await self._die_forever()
        except ConnectionError:  # the client went away: drop its requests quietly
            self._abort_all(reqs)
        except asyncio.CancelledError:
            self._abort_all(reqs)
            raise
        return resp

    def _generate_obj(
        self, req: GenRequest, final: bool, since: int = 0, first: bool = False,
        stream: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        ids = req.output_so_far
        meta = self.meta_info(req, final, first=first, stream=stream)
        if self.args.get("incremental_streaming_output"):
            return {"text": delta_text(ids, since), "output_ids": ids[since:], "meta_info": meta}
        return {
            "text": self.text_of(req, final),
            "output_ids": ids,
            "meta_info": meta,
        }

    async def _die_forever(self) -> web.Response:
        """The scheduler died: the process is going away; never answer."""
        await asyncio.Event().wait()
        return web.Response(status=500)  # pragma: no cover

    # ------------------------------------------------------------------ OpenAI

    def _usage(self, req: GenRequest) -> dict[str, Any]:
        """SGLang's ``UsageInfo``, every field (``prompt_tokens_details`` is set with
        ``--enable-cache-report``; ``completion_tokens_details`` only when there are reasoning
        tokens, never here)."""
        usage: dict[str, Any] = {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.output_tokens,
            "completion_tokens": req.output_tokens,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        if self.args.get("enable_cache_report"):
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _sglext(self, req: GenRequest) -> dict[str, Any] | None:
        """The response-level ``sglext`` of ``return_spec_tokens_details``: SGLang's
        ``SpecTokensDetails`` (every field, the DSpark ones zero); None without speculation."""
        meta = req.meta_spec(self.engine.spec, self.version)
        if not meta:
            return None
        details = {
            "spec_accept_rate": float(meta.get("spec_accept_rate") or 0.0),
            "spec_accept_length": float(meta.get("spec_accept_length") or 0.0),
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": int(meta.get("spec_num_correct_drafts") or 0),
            "spec_num_proposed_drafts": int(meta.get("spec_num_proposed_drafts") or 0),
            "spec_verify_ct": int(meta.get("spec_verify_ct") or 0),
            "spec_correct_drafts_histogram": list(meta.get("spec_correct_drafts_histogram") or []),
            "spec_cap_lens_histogram": [],
        }
        return {"spec_tokens_details": details}

    def _unlimited_budget(self, prompt_tokens: int) -> int:
        """The budget of a request that names none (OpenAI chat without ``max_tokens`` or
        ``max_completion_tokens``, ``max_new_tokens: null``): SGLang's scheduler lets it run to
        the context length, so in practice it ends at end-of-sequence."""
        context = int(self.args.get("context_length") or 0)
        return max(
            0, min(context - prompt_tokens - 1, self.engine.max_total_tokens - prompt_tokens)
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body, refused = await self._json_body(request)
        if refused is not None:
            return refused
        max_tokens: int | None
        if chat:
            parsed = chat_prompt(body.get("messages"))
            if isinstance(parsed, str):
                return _error(400, parsed)
            prompt_key, prompt_text = parsed
            prompt_tokens = count_prompt_tokens(prompt_text)
            # No max-token field: no limit (SGLang passes max_new_tokens None), not 128.
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            obj_kind = "chat.completion"
        else:
            prompt = body.get("prompt")
            if prompt is None:
                return _error(400, "prompt is required")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt_key, prompt_tokens = prompt, count_prompt_tokens(prompt)
            else:
                ids = prompt[0] if prompt and isinstance(prompt[0], list) else prompt
                prompt_key, prompt_tokens = json.dumps(ids), max(1, len(ids))
            max_tokens = body.get("max_tokens")
            max_tokens = 16 if max_tokens is None else max_tokens
            obj_kind = "text_completion"
        try:
            stops = Stops.from_params(body)
        except (TypeError, ValueError) as exc:
            return _error(400, f"invalid stop condition: {exc}")
        budget = self._unlimited_budget(prompt_tokens) if max_tokens is None else int(max_tokens)
        req = self.submit(prompt_key, prompt_tokens, budget, stops=stops, category=_category(body))
        rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        created = int(time.time())
        model = str(body.get("model") or self.model_name)
        spec_details = bool(body.get("return_spec_tokens_details"))
        if not body.get("stream"):
            try:
                await self._run_to_end(req)
            except EngineDead:
                return await self._die_forever()
            except (asyncio.CancelledError, ConnectionError):
                self.engine.abort(req)
                raise
            return web.json_response(
                self._openai_response(req, rid, obj_kind, created, model, spec_details, chat)
            )
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) or bool(
            self.args.get("stream_response_default_include_usage")
        )
        continuous = bool(options.get("continuous_usage_stats"))
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": model}  # fmt: skip
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)

        def chat_chunk(delta: dict[str, Any], finish: dict[str, Any] | None = None,
                       usage: bool = False) -> dict[str, Any]:  # fmt: skip
            # SGLang's msgspec StreamChunk: delta always has reasoning_content (null when
            # there is none), role and content only when set; usage only when asked for.
            c = {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                 "finish_reason": finish["type"] if finish else None,
                 "matched_stop": finish.get("matched") if finish else None}  # fmt: skip
            o: dict[str, Any] = {**head, "choices": [c]}
            if usage:
                o["usage"] = self._usage(req)
            return o

        def completion_chunk(text: str, finish: dict[str, Any] | None) -> dict[str, Any]:
            # SGLang 0.5.23's completion chunk: usage always there (null unless continuous),
            # the unset optional fields (hidden_states, token_ids, sglext) left out.
            c = {"index": 0, "text": text, "logprobs": None,
                 "finish_reason": finish["type"] if finish else None,
                 "matched_stop": finish.get("matched") if finish else None}  # fmt: skip
            usage = self._usage(req) if continuous else None
            return {**head, "choices": [c], "usage": usage}

        try:
            sent = 0  # characters of text sent
            seen = 0  # tokens seen
            async for _ in self.engine.updates(req):
                if req.output_tokens == seen and not req.finished:
                    continue
                if chat and seen == 0:  # the role goes out with the first token, as SGLang's
                    await resp.write(_sse(chat_chunk({"role": "assistant", "content": ""})))
                seen = req.output_tokens
                text = self.text_of(req, final=req.finished)
                delta = text[sent:]
                sent = max(sent, len(text))
                ending = self._finish(req) if req.finished else None
                if chat:  # content, then the finish in a chunk of its own (SGLang's chat)
                    if delta:
                        await resp.write(_sse(chat_chunk({"content": delta}, usage=continuous)))
                    if ending is not None:
                        await resp.write(_sse(chat_chunk({}, ending)))
                    continue
                # Completions: the finish_reason rides on the last content chunk.
                if delta or ending is not None:
                    await resp.write(_sse(completion_chunk(delta, ending)))
            sglext = self._sglext(req) if spec_details else None
            if sglext is not None:  # response-level: a chunk of its own, with no choices
                await resp.write(_sse({**head, "choices": [], "usage": None, "sglext": sglext}))
            if include_usage:
                usage = self._usage(req)
                if not chat:  # SGLang dumps this one with exclude_none
                    usage = {k: v for k, v in usage.items() if v is not None}
                await resp.write(_sse({**head, "choices": [], "usage": usage}))
            await resp.write(b"data: [DONE]\n\n")
        except EngineDead:
            return await self._die_forever()
        except ConnectionError:  # the client went away: drop its request quietly
            self.engine.abort(req)
        except asyncio.CancelledError:
            self.engine.abort(req)
            raise
        return resp

    def _openai_response(
        self,
        req: GenRequest,
        rid: str,
        obj_kind: str,
        created: int,
        model: str,
        spec_details: bool,
        chat: bool,
    ) -> dict[str, Any]:
        """A non-streaming OpenAI response, as SGLang 0.5.23 sends it (unset optional fields
        such as hidden_states and tool_calls left out; the weight versions in ``metadata``)."""
        text = self.text_of(req, final=True)
        finish = self._finish(req)
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None}
        else:
            choice["text"] = text
        choice.update(
            {
                "logprobs": None,
                "finish_reason": finish["type"],
                "matched_stop": finish.get("matched"),
            }
        )
        out: dict[str, Any] = {
            "id": rid,
            "object": obj_kind,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": self._usage(req),
            "metadata": {
                "weight_version": "default",
                "weight_versions": _weight_versions(req.output_tokens),
            },
        }
        sglext = self._sglext(req) if spec_details else None
        if sglext is not None:
            out["sglext"] = sglext
        return out


def _weight_versions(tokens: int) -> list[dict[str, Any]]:
    """SGLang's weight-version spans of an output (one version, never updated here)."""
    return [{"version": "default", "start": 0, "end": tokens}]


def chat_prompt(messages: Any) -> tuple[str, str] | str:
    """The twin's prompt of OpenAI chat ``messages``: (its key, its text), or the error text.

    The twin has no chat template: the prompt is the messages' contents (text parts joined),
    as both ``/v1/chat/completions`` and ``/tokenize`` with ``messages`` count it.
    """
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(str(content or ""))
    return json.dumps(parts), " ".join(parts)
