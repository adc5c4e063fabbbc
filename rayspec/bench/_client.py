"""An async httpx client that streams one request and times every token it receives.

Three endpoints are supported:

- ``generate``: SGLang's native ``POST /generate`` with ``stream: true``. Every SSE chunk
  carries the *cumulative* ``text``/``output_ids`` and ``meta_info.completion_tokens``, so the
  tokens a chunk adds are the increase of ``completion_tokens`` (several at once under
  speculative decoding). The final chunk carries ``spec_verify_ct`` and
  ``spec_correct_drafts_histogram`` when speculation is on.
- ``chat``: ``POST /v1/chat/completions``, the prompt as one user message, read as
  ``completions`` is (the delta's ``content`` instead of ``text``).
- ``completions``: ``POST /v1/completions`` with ``stream_options.include_usage`` and
  ``continuous_usage_stats``; chunks carry delta text and (with continuous usage) a cumulative
  ``usage.completion_tokens``. Without usage on a chunk, a chunk with text counts as one
  token. ``sglext.spec_tokens_details`` (``spec_verify_ct``, ``spec_correct_drafts_histogram``)
  is read when the server sends it: SGLang sends it in a chunk of its own, with no choices.

**Timing.** Two times to first token are kept. ``ttft_ms`` (rayspec's, the one the report,
the summaries and the SLO use) is the time from sending the request to the first chunk that
carries tokens: on ``/generate`` and ``completions`` the first whose token count grew, on
``chat`` the chunk with the assistant's role (SGLang sends it with the first token, whether or
not that token has text). ``ttft_text_ms`` is the time to the first chunk with non-empty text,
as SGLang's ``bench_serving``, AIPerf and the openai client time it (None when no text came:
an answer of special tokens). They differ where the first tokens have no text (a special
token, text the server holds back). Each later chunk's gap since the previous token-carrying
chunk is split evenly over the tokens it added (so ``len(itl_ms)`` is the completion tokens
minus those of the first chunk, and ``sum(itl_ms)`` is the time from the first to the last
token).

**Tokens without text.** SGLang's chat stream sends no chunk for tokens whose text is empty
(a special token such as a pad token, text held back): their count shows in the next chunk's
``usage`` (``continuous_usage_stats``, always asked for) or, at the end, in the final usage
chunk, and they are timed at the last chunk of the choice before it (the finish). A request
whose every token has no text is therefore measured, not failed.

**The twin's clock.** With ``clock="twin"`` (a study whose ``server.engine`` is the twin), every
request is timed by the twin's simulated clock instead of the client's: every ``/generate``
chunk of the twin carries ``meta_info.rayspec_twin`` (a twin-only field: the request's arrival
and its latest tokens, in simulated seconds), and the token arrivals above are taken from it,
so TTFT, the gaps and the request's time are the modelled server's, whatever the host's load
or the client's speed. Under load the record also keeps the arrival on that clock
(``RequestRecord.sim_start_s``) so a closed-loop run's throughput is the twin's too
(:func:`~rayspec.bench.run_tok_s`); a Poisson run (``paced``) keeps its start on the wall
clock, as the client's schedule sends it (the simulated clock does not count an idle engine's
time). What is left of the host under load is which requests share a batch: that depends on
when they reach the engine. A real SGLang server is always timed by the wall clock
(``clock="wall"``, the default): the field is never read from it.

**The prompt's category.** With ``send_category=True`` (a twin study) every request body also
carries a top-level ``rayspec_category`` (the prompt's category in its set; the twin scales the
request's acceptance by it). A real server never receives it: it is sent only to the twin.

Failures are typed (:class:`~rayspec.StreamStalled` for a read timeout or the whole-request
deadline, :class:`~rayspec.BenchError` with ``reason=CRASH_MID_BENCHMARK`` for a cut or refused
connection). :meth:`StreamClient.measure` turns them into a recorded error instead; whether a
failure is fatal is the caller's decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import httpx

from rayspec._exceptions import BenchError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StreamStalled
from rayspec._plural import plural
from rayspec._tls import shared_ssl_context
from rayspec._types import DEFAULT_CATEGORY
from rayspec._types import RequestRecord

_META_KEY = '"meta_info":'
_DECODER = json.JSONDecoder()

_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.CloseError,
)


def _parse_generate_chunk(payload: bytes, whole: bool = False) -> Any:
    """Parse a ``/generate`` chunk, decoding only its ``meta_info`` when possible.

    Cumulative chunks grow with the output (``text`` and ``output_ids`` of every token so far),
    and a full ``json.loads`` of each was the largest client cost per chunk. An unescaped
    ``"meta_info":`` can only be a key (quotes inside JSON strings are escaped), so the object
    after its last occurrence is decoded alone; anything unusual (no ``meta_info``, no
    ``completion_tokens``, an error chunk) falls back to a full parse, and so does ``whole``
    (the caller still looks for the first text: early chunks are small).
    """
    text = payload.decode()
    i = -1 if whole else text.rfind(_META_KEY)
    if i >= 0:
        j = i + len(_META_KEY)
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        try:
            meta, _ = _DECODER.raw_decode(text, j)
        except json.JSONDecodeError:
            meta = None
        # The final chunk (finish_reason set) is parsed whole, once per request: its
        # output_ids are the greedy output the correctness gate compares.
        final = isinstance(meta, dict) and bool(meta.get("finish_reason"))
        if isinstance(meta, dict) and "completion_tokens" in meta and not final:
            return {"meta_info": meta}
    return json.loads(text)


_CLOCKS = ("wall", "twin")
_TWIN_CLOCK_KEY = "rayspec_twin"
_TWIN_CATEGORY_KEY = "rayspec_category"


def _twin_stamps(meta: dict[str, Any]) -> tuple[float, float]:
    """The request's arrival and the chunk's latest tokens on the twin's simulated clock (s).

    Raises:
        BenchError: the chunk has no twin clock (the server is not rayspec's twin).
    """
    clock = meta.get(_TWIN_CLOCK_KEY)
    if not isinstance(clock, dict):
        clock = {}
    token_s = clock.get("sim_token_s")
    if token_s is None or clock.get("sim_arrival_s") is None:
        raise BenchError(
            f"clock 'twin': a /generate chunk without meta_info.{_TWIN_CLOCK_KEY}.sim_token_s "
            "(is the server rayspec's twin?)"
        )
    return float(clock["sim_arrival_s"]), float(token_s)


def _read_histogram(fields: dict[str, Any], state: dict[str, Any]) -> None:
    """The request's accept histogram, from ``meta_info`` or ``spec_tokens_details``
    (``spec_accept_histogram``: its name in SGLang 0.5.12-0.5.20)."""
    hist = fields.get("spec_correct_drafts_histogram") or fields.get("spec_accept_histogram")
    if isinstance(hist, list) and hist:
        state["histogram"] = tuple(int(n) for n in hist)


@dataclasses.dataclass
class _Timeline:
    """Token arrival bookkeeping for one stream (mutable, private to one request).

    ``t0`` is when the request was sent (``perf_counter``); token times are on the clock whose
    zero is ``origin``: ``t0`` for the wall clock, 0 for the twin's (simulated seconds since
    the request arrived, so a twin-timed request's figures do not depend on ``t0``).
    """

    t0: float
    origin: float | None = None  # None: t0 (the wall clock)
    tokens: int = 0
    ttft_s: float | None = None
    text_s: float | None = None  # to the first chunk with non-empty text
    last_s: float = 0.0
    itl_s: list[float] = dataclasses.field(default_factory=list)

    def saw_text(self, now: float) -> None:
        if self.text_s is None:
            self.text_s = now - (self.t0 if self.origin is None else self.origin)

    def advance(self, now: float, cumulative_tokens: int) -> None:
        new = cumulative_tokens - self.tokens
        if new <= 0:
            return
        if self.ttft_s is None:
            self.ttft_s = now - (self.t0 if self.origin is None else self.origin)
        else:
            gap = (now - self.last_s) / new
            self.itl_s.extend([gap] * new)
        self.tokens = cumulative_tokens
        self.last_s = now


@dataclasses.dataclass(frozen=True)
class StreamResult:
    """What one successful stream measured (seconds, ``time.perf_counter`` based)."""

    t0: float
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    itl_s: tuple[float, ...]
    spec_verify_ct: int | None
    chunks: int
    server_e2e_s: float | None = None  # meta_info.e2e_latency of the final chunk, if sent
    sent_s: float | None = None  # perf_counter when the request body was fully written
    output_ids: tuple[int, ...] | None = None  # the final chunk's token ids (/generate)
    accept_histogram: tuple[int, ...] | None = None  # verify steps by drafts accepted
    sim_arrival_s: float | None = None  # the arrival on the twin's clock (twin-timed only)
    ttft_text_s: float | None = None  # to the first non-empty text (None: no text came)


class _Partial(Exception):
    """Carries the timeline of a stream that failed, next to the typed error.

    Private control flow, outside rayspec's exception tree on purpose: it never leaves the
    client (``stream`` raises its ``error``, ``measure`` records it).
    """

    def __init__(
        self,
        error: BenchError,
        timeline: _Timeline,
        now: float,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.timeline = timeline
        self.now = now
        self.cause = cause


def failure_of(record: RequestRecord) -> FailureReason | None:
    """The class of a recorded request error (None for a successful request)."""
    return record.failure


class StreamClient:
    """Streams requests to one server over ``max_streams`` keep-alive connections.

    Each stream slot ("lane") is its own ``httpx.AsyncClient`` holding one connection, and a
    request takes a free lane before it starts (its TTFT clock starts once it has one). One
    shared pool of ``max_streams`` connections would be the plain httpx set-up
    (``Limits(max_connections >= streams)``: the default pool of 100 queues the rest), but
    httpcore 1.0's pool re-scans every queued request against every connection (with a
    ``getpeername`` and a ``poll`` per idle connection) on each request start and close: at 64
    streams that cost
    seconds of client CPU per run and delayed request sends by up to ~2 s (measured with
    ``benchmarks/client_fidelity.py``). Lanes make a request start O(1).

    Args:
        base_url: e.g. ``"http://127.0.0.1:30000"``.
        max_streams: the most requests in flight at once (one connection each).
        endpoint: ``"generate"``, ``"completions"`` or ``"chat"``.
        clock: ``"wall"`` (the client's clock, always for a real server) or ``"twin"``
            (requests timed by the twin's simulated clock; ``generate`` only).
        send_category: send each request's category as ``rayspec_category`` (the twin only).
        read_timeout_s: the longest gap allowed between two chunks.
        request_timeout_s: deadline for one whole request.
        temperature, ignore_eos, model: request fields.
        transport: the httpx transport every connection goes through (default: the network);
            e.g. an ``httpx.MockTransport`` that answers a test's requests without a server.

    Use it as an async context manager::

        async with StreamClient("http://127.0.0.1:30000", max_streams=1) as client:
            result = await client.stream("Hello", max_tokens=16)
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_streams: int = 1,
        endpoint: str = "generate",
        clock: str = "wall",
        send_category: bool = False,
        read_timeout_s: float = 30.0,
        request_timeout_s: float = 600.0,
        temperature: float = 0.0,
        ignore_eos: bool = True,
        model: str = "default",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if endpoint not in ("generate", "completions", "chat"):
            raise ValueError(
                f"endpoint={endpoint!r}: expected 'generate', 'completions' or 'chat'"
            )
        if clock not in _CLOCKS:
            raise ValueError(f"clock={clock!r}: expected 'wall' or 'twin'")
        if clock == "twin" and endpoint != "generate":
            raise ValueError(
                "clock='twin' reads /generate's meta_info: expected endpoint='generate'"
            )
        if max_streams < 1:
            raise ValueError(f"max_streams={max_streams!r}: expected >= 1")
        self.base_url = base_url.rstrip("/")
        self.endpoint = endpoint
        self.clock = clock
        self.send_category = send_category
        self.max_streams = max_streams
        self.read_timeout_s = float(read_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.temperature = float(temperature)
        self.ignore_eos = ignore_eos
        self.model = model
        ssl_context = shared_ssl_context()  # httpx would build one per client
        timeout = httpx.Timeout(connect=5.0, read=self.read_timeout_s, write=10.0, pool=None)
        self._lanes_all = [
            httpx.AsyncClient(
                base_url=self.base_url,
                trust_env=False,
                verify=ssl_context,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                timeout=timeout,
                transport=transport,
            )
            for _ in range(max_streams)
        ]
        self._lanes: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for lane in self._lanes_all:
            self._lanes.put_nowait(lane)
        self._control = httpx.AsyncClient(
            base_url=self.base_url,
            trust_env=False,
            verify=ssl_context,
            timeout=httpx.Timeout(10.0),
            transport=transport,
        )
        # One (unix, perf_counter) anchor: start stamps keep perf_counter's precision.
        self._anchor_unix = time.time()
        self._anchor_perf = time.perf_counter()

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for lane in self._lanes_all:
            await lane.aclose()
        await self._control.aclose()

    @property
    def http(self) -> httpx.AsyncClient:
        """A separate small client for non-streaming calls such as ``/flush_cache``."""
        return self._control

    def unix_time(self, perf: float) -> float:
        """Convert a ``time.perf_counter()`` value of this process to a unix timestamp."""
        return self._anchor_unix + (perf - self._anchor_perf)

    def _payload(
        self, prompt: str, max_tokens: int, category: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        if self.endpoint == "generate":
            body: dict[str, Any] = {
                "text": prompt,
                "sampling_params": {
                    "max_new_tokens": max_tokens,
                    "temperature": self.temperature,
                    "ignore_eos": self.ignore_eos,
                },
                "stream": True,
            }
            path = "/generate"
        else:
            body = {
                "model": self.model,
                "max_tokens": max_tokens,
                "temperature": self.temperature,
                "ignore_eos": self.ignore_eos,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                "return_spec_tokens_details": True,
            }
            if self.endpoint == "chat":
                path = "/v1/chat/completions"
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                path = "/v1/completions"
                body["prompt"] = prompt
        if self.send_category and category is not None:
            body[_TWIN_CATEGORY_KEY] = category  # the twin's own field, never SGLang's
        return path, body

    async def stream(
        self, prompt: str, max_tokens: int, *, twin_clock: bool = False
    ) -> StreamResult:
        """Send one streaming request and time it (``twin_clock``: by the twin's simulated
        clock; only with ``clock="twin"``).

        Raises:
            StreamStalled: no chunk within ``read_timeout_s``, or the request passed its
                deadline.
            BenchError: the connection was refused or cut (``reason=CRASH_MID_BENCHMARK``), the
                server answered with an HTTP error or an ``{"error": ...}`` chunk, or the stream
                ended before the request finished.
        """
        if twin_clock and self.clock != "twin":
            raise ValueError("twin_clock=True needs StreamClient(clock='twin')")
        try:
            return await self._stream(prompt, max_tokens, twin_clock)
        except _Partial as partial:
            if partial.cause is None:
                raise partial.error from None
            raise partial.error from partial.cause

    async def _stream(
        self, prompt: str, max_tokens: int, twin_clock: bool, category: str | None = None
    ) -> StreamResult:
        lane = await self._lanes.get()
        try:
            return await self._stream_on(lane, prompt, max_tokens, twin_clock, category)
        finally:
            self._lanes.put_nowait(lane)

    async def _stream_on(
        self,
        lane: httpx.AsyncClient,
        prompt: str,
        max_tokens: int,
        twin_clock: bool,
        category: str | None = None,
    ) -> StreamResult:
        path, payload = self._payload(prompt, max_tokens, category)
        t0 = time.perf_counter()
        tl = _Timeline(t0=t0, origin=0.0 if twin_clock else t0)
        state: dict[str, Any] = {
            "prompt_tokens": 0,
            "verify": None,
            "finished": False,
            "server_e2e": None,
            "output_ids": None,
            "histogram": None,
            "twin_clock": twin_clock,
            "sim_arrival": None,
            "last_choice_s": None,  # when the latest chunk with choices came
        }
        chunks = 0
        end = t0
        done = False  # [DONE] seen: a failure after it (while draining) loses nothing
        sent: list[float] = []

        async def trace(event: str, info: dict[str, Any]) -> None:
            # httpcore's trace hook: when the request left the client (send-side delay).
            if event == "http11.send_request_body.complete":
                sent.append(time.perf_counter())

        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with lane.stream(
                    "POST", path, json=payload, extensions={"trace": trace}
                ) as response:
                    if response.status_code != 200:
                        body = (await response.aread()).decode(errors="replace")[:500]
                        raise BenchError(
                            f"POST {path} returned HTTP {response.status_code}: {body.strip()}"
                        )
                    buf = b""
                    async for data in response.aiter_bytes():
                        if done:
                            # Read the response to its end (the chunked terminator follows
                            # [DONE] at once): a response left unread closes the connection,
                            # and the next request would pay for a new one.
                            continue
                        now = time.perf_counter()
                        buf += data
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if not line.startswith(b"data:"):
                                continue
                            body_bytes = line[5:].strip()
                            if body_bytes == b"[DONE]":
                                done = True
                                end = now
                                break
                            chunks += 1
                            try:
                                obj = (
                                    _parse_generate_chunk(body_bytes, tl.text_s is None)
                                    if self.endpoint == "generate"
                                    else json.loads(body_bytes)
                                )
                                self._on_chunk(obj, now, tl, state)
                            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                                raise BenchError(
                                    f"malformed SSE chunk from POST {path} "
                                    f"({type(exc).__name__}: {exc}): {body_bytes[:200]!r}"
                                ) from exc
                    if not done:
                        end = time.perf_counter()
                    if not done and not state["finished"]:
                        raise BenchError(
                            f"stream ended after {plural(tl.tokens, 'token')} without a final "
                            "chunk "
                            "(server closed the response early)",
                            reason=FailureReason.CRASH_MID_BENCHMARK,
                        )
        except BenchError as exc:
            raise _Partial(exc, tl, time.perf_counter(), exc.__cause__) from exc
        except (httpx.ReadTimeout, TimeoutError, *_CONNECTION_ERRORS) as exc:
            if not done:
                raise self._partial_from(exc, tl, path) from exc
        if tl.ttft_s is None:
            err = BenchError(f"POST {path} finished without any token")
            raise _Partial(err, tl, end)
        # On the twin's clock the request ends with its last token.
        e2e_s = tl.last_s if twin_clock else end - t0
        return StreamResult(
            t0=t0,
            prompt_tokens=int(state["prompt_tokens"]),
            completion_tokens=tl.tokens,
            ttft_s=tl.ttft_s,
            e2e_s=e2e_s,
            itl_s=tuple(tl.itl_s),
            spec_verify_ct=state["verify"],
            chunks=chunks,
            server_e2e_s=state["server_e2e"],
            sent_s=sent[0] if sent else None,
            output_ids=state["output_ids"],
            accept_histogram=state["histogram"],
            sim_arrival_s=state["sim_arrival"],
            ttft_text_s=tl.text_s,
        )

    def _partial_from(self, exc: Exception, tl: _Timeline, path: str) -> _Partial:
        """The typed error for a transport failure or timeout, with what was measured."""
        now = time.perf_counter()
        if isinstance(exc, httpx.ReadTimeout):
            err: BenchError = StreamStalled(
                f"no chunk for {self.read_timeout_s:g} s after {plural(tl.tokens, 'token')} "
                f"(POST {path} stalled)"
            )
        elif isinstance(exc, TimeoutError):
            err = StreamStalled(
                f"request passed its {self.request_timeout_s:g} s deadline after "
                f"{plural(tl.tokens, 'token')}"
            )
        else:
            err = BenchError(
                f"connection to {self.base_url} lost after {plural(tl.tokens, 'token')} "
                f"({type(exc).__name__}: {exc or 'no detail'}); the server may have crashed",
                reason=FailureReason.CRASH_MID_BENCHMARK,
            )
        return _Partial(err, tl, now, exc)

    def _on_chunk(self, obj: Any, now: float, tl: _Timeline, state: dict[str, Any]) -> None:
        if not isinstance(obj, dict):
            raise BenchError(f"unexpected SSE chunk (not an object): {str(obj)[:200]}")
        if "error" in obj:
            raise BenchError(f"server sent an error chunk: {json.dumps(obj['error'])[:300]}")
        if self.endpoint == "generate":
            meta = obj.get("meta_info") or {}
            ct = meta.get("completion_tokens")
            if ct is None:
                ct = len(obj.get("output_ids") or ())
            if state["twin_clock"] and int(ct) > tl.tokens:
                arrival, token = _twin_stamps(meta)
                state["sim_arrival"] = arrival
                now = token - arrival
            tl.advance(now, int(ct))
            if obj.get("text"):  # cumulative: the first chunk with any text
                tl.saw_text(now)
            if "prompt_tokens" in meta:
                state["prompt_tokens"] = meta["prompt_tokens"]
            if meta.get("spec_verify_ct") is not None:
                state["verify"] = int(meta["spec_verify_ct"])
            _read_histogram(meta, state)
            if meta.get("e2e_latency") is not None:
                state["server_e2e"] = float(meta["e2e_latency"])
            finish = meta.get("finish_reason")
            ids = obj.get("output_ids")
            if finish and isinstance(ids, list):
                state["output_ids"] = tuple(int(i) for i in ids)
        else:
            usage = obj.get("usage") or {}
            choices = obj.get("choices") or []
            finish = None
            if choices:
                choice = choices[0]
                finish = choice.get("finish_reason")
                delta = choice.get("delta") or {}
                text = choice.get("text") or delta.get("content")
                state["last_choice_s"] = now
                if delta.get("role") and not tl.tokens:
                    # SGLang sends the chat role with the first token (text or not).
                    tl.advance(now, 1)
                    state["role_token"] = True  # counted: a first text without usage is it
                if usage.get("completion_tokens") is not None:
                    tl.advance(now, int(usage["completion_tokens"]))
                    state["role_token"] = False
                elif text and not state.pop("role_token", False):
                    tl.advance(now, tl.tokens + 1)
                if text:
                    tl.saw_text(now)
            elif usage.get("completion_tokens") is not None:
                # Final usage chunk: the authoritative count. Tokens no chunk carried (no
                # text: a chat stream sends nothing for them) came by the choice's last chunk.
                tl.advance(state["last_choice_s"] or now, int(usage["completion_tokens"]))
                state["finished"] = True
            if usage.get("prompt_tokens") is not None:
                state["prompt_tokens"] = usage["prompt_tokens"]
            details = (obj.get("sglext") or {}).get("spec_tokens_details") or {}
            if details.get("spec_verify_ct") is not None:
                state["verify"] = int(details["spec_verify_ct"])
            _read_histogram(details, state)
        if finish:
            state["finished"] = True
            if isinstance(finish, dict) and finish.get("type") == "abort":
                raise BenchError(f"server aborted the request: {json.dumps(finish)[:300]}")

    async def measure(
        self,
        prompt: str,
        max_tokens: int,
        *,
        scenario: str,
        run: int,
        index: int,
        concurrency: int,
        category: str = DEFAULT_CATEGORY,
        paced: bool = False,
    ) -> RequestRecord:
        """Stream one request and return its record; a failure becomes ``record.failure``
        (its :class:`~rayspec.FailureReason`) and ``record.error`` (the message).
        ``category`` (the prompt's category in its set) is kept on the record.

        A failed record keeps what was measured before the failure (tokens so far, TTFT when
        a token arrived, NaN otherwise). With ``clock="twin"`` the request is timed by the
        twin's simulated clock (see the module docstring); ``paced`` (a Poisson run's
        request) keeps its start on the wall clock (``sim_start_s`` None).
        """
        twin_clock = self.clock == "twin"
        try:
            res = await self._stream(prompt, max_tokens, twin_clock, category)
        except _Partial as partial:
            tl = partial.timeline
            return RequestRecord(
                scenario=scenario,
                run=run,
                index=index,
                concurrency=concurrency,
                prompt_tokens=0,
                completion_tokens=tl.tokens,
                ttft_ms=tl.ttft_s * 1000.0 if tl.ttft_s is not None else float("nan"),
                ttft_text_ms=tl.text_s * 1000.0 if tl.text_s is not None else None,
                e2e_ms=(partial.now - tl.t0) * 1000.0,
                itl_ms=tuple(x * 1000.0 for x in tl.itl_s),
                start_unix_s=self.unix_time(tl.t0),
                error=str(partial.error),
                failure=partial.error.reason,
                category=category,
            )
        verify = res.spec_verify_ct
        return RequestRecord(
            scenario=scenario,
            run=run,
            index=index,
            concurrency=concurrency,
            prompt_tokens=res.prompt_tokens,
            completion_tokens=res.completion_tokens,
            ttft_ms=res.ttft_s * 1000.0,
            ttft_text_ms=res.ttft_text_s * 1000.0 if res.ttft_text_s is not None else None,
            e2e_ms=res.e2e_s * 1000.0,
            itl_ms=tuple(x * 1000.0 for x in res.itl_s),
            start_unix_s=self.unix_time(res.t0),
            spec_verify_ct=verify,
            accept_length=res.completion_tokens / verify if verify else None,
            output_ids=res.output_ids,
            accept_histogram=res.accept_histogram,
            category=category,
            sim_start_s=None if paced else res.sim_arrival_s,
        )
