"""SGLang's HTTP API for the twin (``docs/sglang.md``, *HTTP API*), on aiohttp: the routes, the
status endpoints and the generation core the streams share.

Shapes follow SGLang 0.5.23: ``/server_info`` with the resolved arguments and
``internal_states``; ``/flush_cache`` (400 when busy); ``/metrics`` under ``--enable-metrics``;
``/v1/loads``; FastAPI's JSON 404 and 405 bodies; the error bodies of each layer of SGLang's
request handling (:mod:`rayspec.twin._replies`). ``/generate`` is :mod:`rayspec.twin._native`,
the OpenAI endpoints :mod:`rayspec.twin._openai`. Version gates: ``/server_info`` and
``/model_info`` from 0.5.12, ``/ready`` from 0.5.20, HTTP 400 for unknown ``sampling_params``
keys from 0.5.22, ``/v1/loads`` in 0.5.23.

How a request ends is :mod:`rayspec.twin._ends` (budget, end-of-sequence unless ``ignore_eos``,
``stop`` strings and ``stop_token_ids``, ``min_new_tokens``); its tokens are made as the engine
generates them, never the whole budget up front, and a budget past the context length is
refused as SGLang refuses it (400). The twin's answers run at least 512 tokens before their
end-of-sequence token, so short requests get their whole budget; the benchmark client always
sends ``ignore_eos``. ``/tokenize`` and ``/detokenize`` use the twin's words (one token per
word). ``cached_tokens`` is always 0 (no prefix cache).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rayspec.twin import _native
from rayspec.twin import _openai
from rayspec.twin._ends import Completion
from rayspec.twin._ends import End
from rayspec.twin._ends import Stops
from rayspec.twin._engine import Engine
from rayspec.twin._engine import GenRequest
from rayspec.twin._log import SglangLog
from rayspec.twin._metrics import MetricsRegistry
from rayspec.twin._replies import invalid_json
from rayspec.twin._replies import method_not_allowed
from rayspec.twin._replies import not_an_object
from rayspec.twin._replies import not_found
from rayspec.twin._replies import openai_error
from rayspec.twin._replies import weight_versions
from rayspec.twin._resolve import Resolution
from rayspec.twin._text import detokenize
from rayspec.twin._text import encode

FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
FLUSH_BUSY = (
    "Cache not flushed.\nPlease check backend logs for more details. (When there are running "
    "or waiting requests, the operation will not be performed.)\n"
)
# The twin's own resolved values, not SGLang server arguments: left out of /server_info.
_TWIN_ARGS = frozenset({"twin_version", "cuda_graph_decode_enabled", "twin_text"})
_KEEP_ENDS = 4096  # ends of requests long served are forgotten
# /model_info's embedding block of a generation model (SGLang 0.5.23's, as recorded).
_EMBEDDING = {
    "family": "none", "task": "none", "execution": "none", "attention": "none",
    "pooling": "model_defined", "normalize": False, "postprocessor": "none",
    "tokenizer_special_tokens": "model_default", "supports_dimensions": False,
    "supports_token_embeddings": False, "supports_multimodal": False,
    "requires_embedding_flag": False, "auto_enable_embedding": False,
    "bcg_eligibility": "disabled", "safe_disable_kv_cache": False,
    "safe_disable_radix_cache": False, "safe_disable_chunked_prefill": False,
    "enabled": False, "matryoshka_dimensions": [],
    "bcg": {"prefill_backend": "disabled", "enabled": False, "capture_token_budget": 4096,
            "capture_batch_sizes": [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]},
    "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False,
              "chunked_prefill_disabled": False},
}  # fmt: skip
_JSON_TYPES = ("application/json",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ServerState:
    """Lifecycle of one twin start: LOADING -> WARMUP -> READY (or stays, on a fault)."""

    LOADING = "loading"
    WARMUP = "warmup"
    READY = "ready"


class _NoContentType(web.Response):
    """A body sent without a ``Content-Type`` header, as SGLang's ``/flush_cache`` sends it."""


async def _drop_content_type(request: web.Request, response: web.StreamResponse) -> None:
    if isinstance(response, _NoContentType):
        response.headers.popall("Content-Type", None)


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
        model_type: ``/model_info``'s ``model_type`` (the model folder's, else the profile's).
        pad_text: every answer is the pad token (``--twin-text pad``): tokens with no text.
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
        model_type: str = "kimi_k25",
        pad_text: bool = False,
    ) -> None:
        self._engine = engine
        self.resolution = resolution
        self.args = resolution.args
        self.log = log
        self.version = version
        self.version_text = version_text
        self.seed = seed
        self.corrupt_outputs = False  # set when the NCCL setup corrupts data (LL128 on PCIe)
        self.pad_text = pad_text
        self.twin_info = twin_info
        self.metrics = metrics
        self.launch_command = launch_command
        self.model_type = model_type
        self.state = ServerState.LOADING
        self.startup_time = time.time()
        self.ready_time = self.startup_time  # set when the server is ready
        self.model_name = str(self.args.get("served_model_name") or self.args["model_path"])
        self.health_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.on_request_start: Callable[[], None] | None = None
        self._completions: dict[int, Completion] = {}  # engine request index -> its output

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

    @property
    def context_length(self) -> int:
        return int(self.args.get("context_length") or 0)

    # ------------------------------------------------------------------ app

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log], client_max_size=64 * 1024**2)
        app.on_response_prepare.append(_drop_content_type)
        r = app.router

        def bound(handler: Callable[[TwinServer, web.Request], Awaitable[Any]]) -> Handler:
            async def handle(request: web.Request) -> web.StreamResponse:
                response: web.StreamResponse = await handler(self, request)
                return response

            return handle

        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        if self.version >= (0, 5, 20):
            r.add_get("/ready", self.ready)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/get_server_info", self.server_info)
        if self.version >= (0, 5, 12):
            r.add_get("/model_info", self.model_info)
            r.add_get("/server_info", self.server_info)
        if self.version >= (0, 5, 23):  # seen in 0.5.23; when it came is not recorded here
            r.add_get("/v1/loads", self.loads)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/set_internal_state", self.set_internal_state)
        r.add_route("PUT", "/set_internal_state", self.set_internal_state)
        r.add_post("/generate", bound(_native.generate))
        r.add_put("/generate", bound(_native.generate))
        r.add_post("/v1/completions", bound(_openai.completions))
        r.add_post("/v1/chat/completions", bound(_openai.chat_completions))
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
    async def _access_log(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPNotFound:  # FastAPI's bodies, JSON (aiohttp's are text)
            response = not_found()
        except web.HTTPMethodNotAllowed:
            response = method_not_allowed()
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
                "model_type": self.model_type,
                "architectures": [self.twin_info.get("architecture", "")],
                "embedding": _EMBEDDING,
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

    async def loads(self, request: web.Request) -> web.Response:
        """``GET /v1/loads``: the scheduler's load, in SGLang 0.5.23's shape (no prefix cache,
        no disaggregation, no memory figures in the twin: those at zero)."""
        eng = self.engine
        used = eng.used_tokens
        waiting = eng.waiting_prompt_tokens
        load = {
            "timestamp": time.time(), "dp_rank": 0,
            "num_running_reqs": eng.num_running, "num_waiting_reqs": eng.num_waiting,
            "num_waiting_uncached_tokens": waiting, "num_used_tokens": used,
            "num_total_tokens": used + waiting, "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0, "max_total_num_tokens": eng.max_total_tokens,
            "max_running_requests": eng.cap, "token_usage": round(used / eng.max_total_tokens, 4),
            "gen_throughput": eng.stats.last_gen_throughput, "cache_hit_rate": 0.0,
            "utilization": round(eng.num_running / eng.cap, 4),
            "total_prefill_uncached_tokens": eng.stats.prompt_tokens,
            "total_prefill_busy_us": 0, "decode_moments": [0.0] * 6,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                       "token_capacity": eng.max_total_tokens},
            "disaggregation": {
                "mode": "null", "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0, "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0},
            "queues": {"waiting": eng.num_waiting, "grammar": 0, "paused": 0, "retracted": 0,
                       "prealloc_ready": 0},
        }  # fmt: skip
        if eng.spec is not None:  # the latest decode-log window's, as SGLang's scheduler keeps
            load["speculative"] = {"accept_length": eng.stats.last_accept_length,
                                   "accept_rate": eng.stats.last_accept_rate}  # fmt: skip
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        return web.json_response({
            "timestamp": stamp, "version": self.version_text, "accelerator": None,
            "num_accelerators": int(self.args.get("tp_size") or 1), "loads": [load]})  # fmt: skip

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.engine.flush():
            self.log.scheduler(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {self.engine.num_waiting}, #running-req: {self.engine.num_running}",
                logging.WARNING,
            )
            return _NoContentType(status=400, body=FLUSH_BUSY.encode())
        self.log.scheduler("Cache flushed successfully!")
        return _NoContentType(status=200, body=FLUSH_OK.encode())

    async def set_internal_state(self, request: web.Request) -> web.Response:
        body, refused = await self.json_body(request, "SetInternalStateReq")
        if refused is not None:
            return refused
        updates = body.get("server_args", {})
        allowed = {
            "pp_max_micro_batch_size",
            "speculative_accept_threshold_single",
            "speculative_accept_threshold_acc",
        }
        if not isinstance(updates, dict) or any(
            k not in allowed and not k.startswith("dspark_") for k in updates
        ):
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
        body, refused = await self.json_body(request, "TokenizeRequest")
        if refused is not None:
            return refused
        prompt = body.get("prompt")
        max_len = int(self.args.get("context_length") or -1)
        if body.get("messages") is not None:  # SGLang takes messages before prompt
            chat = _openai.chat_prompt(body["messages"])
            if isinstance(chat, str):
                return openai_error(chat)
            ids = encode(chat[1])
            return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": max_len})
        if isinstance(prompt, str):
            ids = encode(prompt)
            return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": max_len})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            lists = [encode(p) for p in prompt]
            return web.json_response({"tokens": lists, "count": [len(x) for x in lists],
                                      "max_model_len": max_len})  # fmt: skip
        message = f"Invalid prompt type: {type(prompt)}. Expected str or List[str]."
        return openai_error(message, err_type="BadRequest")

    async def detokenize(self, request: web.Request) -> web.Response:
        """``POST /detokenize`` and ``/v1/detokenize``: ``{"tokens": [int] | [[int]],
        "skip_special_tokens": bool}`` to ``{"text"}`` (the special tokens have text only
        with ``skip_special_tokens`` false)."""
        body, refused = await self.json_body(request, "DetokenizeRequest")
        if refused is not None:
            return refused
        tokens = body.get("tokens")
        skip = body.get("skip_special_tokens", True)
        if not isinstance(skip, bool):
            return openai_error(
                "Invalid input: 'skip_special_tokens' must be a boolean.", err_type="BadRequest"
            )
        if isinstance(tokens, list) and not tokens:
            return web.json_response({"text": ""})
        if isinstance(tokens, list) and all(_is_int(t) for t in tokens):
            return web.json_response({"text": detokenize(tokens, skip_special_tokens=skip)})
        if isinstance(tokens, list) and all(
            isinstance(ts, list) and all(_is_int(t) for t in ts) for ts in tokens
        ):
            texts = [detokenize(ts, skip_special_tokens=skip) for ts in tokens]
            return web.json_response({"text": texts})
        return openai_error("Invalid input: 'tokens' must be a list of integers or of lists of "
                            "integers.", err_type="BadRequest")  # fmt: skip

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

    def check_serving(self) -> web.Response | None:
        if self.state == ServerState.LOADING or not self.has_engine:
            return web.Response(status=503, text="The server is starting.")
        return None

    async def json_body(
        self, request: web.Request, model: str
    ) -> tuple[dict[str, Any], web.Response | None]:
        """The request's JSON object, or the response refusing it (not serving; a body that
        is not a JSON object, answered as SGLang's request model ``model`` refuses it)."""
        blocked = self.check_serving()
        if blocked is not None:
            return {}, blocked
        raw = await request.read()
        if request.content_type not in _JSON_TYPES and not request.content_type.endswith("+json"):
            return {}, not_an_object(raw, model)  # FastAPI: not JSON, the body is bytes
        try:
            body = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, too deep
            return {}, invalid_json(ValueError(str(exc)))
        if not isinstance(body, dict):
            return {}, not_an_object(body, model)
        return body, None

    def context_error(self, prompt_tokens: int, max_new_tokens: int | None) -> str | None:
        """SGLang's refusal of a prompt or budget that the context length cannot hold (the
        tokenizer manager's ``_validate_one_request``), or None."""
        context = self.context_length
        if context <= 0:
            return None
        if prompt_tokens >= context:
            return (
                f"The input ({prompt_tokens} tokens) is longer than the model's context "
                f"length ({context} tokens)."
            )
        if max_new_tokens is not None and prompt_tokens + max_new_tokens > context:
            return (
                "Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {prompt_tokens + max_new_tokens} "
                f"tokens: {prompt_tokens} tokens from the input messages and {max_new_tokens} "
                "tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )
        return None

    def unlimited_budget(self, prompt_tokens: int) -> int:
        """The budget of a request that names none (OpenAI chat without ``max_tokens`` or
        ``max_completion_tokens``, ``max_new_tokens: null``): SGLang's scheduler lets it run to
        the context length, so in practice it ends at end-of-sequence."""
        return max(
            0,
            min(
                self.context_length - prompt_tokens - 1,
                self.engine.max_total_tokens - prompt_tokens,
            ),
        )

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

        Its tokens are made as the engine generates them (:class:`Completion`), which also
        decides its end: nothing of the output exists before it is generated.
        """
        if self.on_request_start is not None:
            self.on_request_start()
        budget = max(0, max_new_tokens)
        completion = Completion(
            self.seed, prompt_key, budget, stops or Stops(), corrupt=self.corrupt_outputs,
            pad=self.pad_text,
        )  # fmt: skip
        req = self.engine.submit(
            rid=rid or uuid.uuid4().hex,
            prompt_tokens=prompt_tokens,
            max_new_tokens=budget,
            source=completion,
            category=category,
        )
        self._completions[req.index] = completion
        while len(self._completions) > _KEEP_ENDS:
            del self._completions[next(iter(self._completions))]
        return req

    def _end(self, req: GenRequest) -> End | None:
        completion = self._completions.get(req.index)
        return completion.end if completion is not None else None

    def finish_reason(self, req: GenRequest) -> dict[str, Any]:
        """The finish_reason of a finished request (``meta_info``'s form)."""
        if req.aborted:
            return {"type": "abort", "message": "aborted"}
        end = self._end(req)
        return end.finish if end is not None else {"type": "length", "length": req.max_new_tokens}

    def text_of(self, req: GenRequest, final: bool) -> str:
        """The request's text so far; the final text without a matched stop string or token
        (unless ``no_stop_trim``)."""
        ids = req.output_so_far
        end = self._end(req) if final else None
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
            "finish_reason": self.finish_reason(req) if final else None,
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
            meta["weight_versions"] = weight_versions(req.output_tokens)
        meta["cached_tokens_details"] = None  # SGLang's when no token was cached (no cache here)
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

    async def run_to_end(self, req: GenRequest) -> None:
        async for _ in self.engine.updates(req):
            pass

    async def merged_updates(
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

    def abort_all(self, reqs: list[GenRequest]) -> None:
        for req in reqs:
            self.engine.abort(req)

    async def die_forever(self) -> web.Response:
        """The scheduler died: the process is going away; never answer."""
        await asyncio.Event().wait()
        return web.Response(status=500)  # pragma: no cover


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
