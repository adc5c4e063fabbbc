"""SGLang's dialect as rayspec meets it, compared by shape: the same requests go to the twin and
to real SGLang, and what comes back is compared by key sets and value types, recursively, not
by value.

``probe`` sends every request rayspec sends (and those outside clients send: the OpenAI stream
and non-stream forms, ``/tokenize``, ``/detokenize``, ``/v1/models``), then the error and edge
requests of ``EDGE_PROBES`` (refusals of every layer, budgets past the context length, ``n``,
logprobs, ``/v1/loads``, ``/model_info``, 404 and 405), and keeps the answers; where a value
matters, not only its type (the status, the content type, an id's form, the context length),
it is part of the answer's keys (``"400 application/json"``), so a different value is a
different shape. ``probe_textless`` is the stream of an answer whose tokens have no text (the
always-agreeing pair's: token 0, a special token; the twin's ``--twin-text pad``);
``log_answers`` reads the log lines rayspec parses, with rayspec's own parsers; ``shapes`` turns
answers into ``{probe: {path: [types]}}``. ``READS`` lists what rayspec reads, with the code that
reads it. ``problems`` holds the rules: every read path in both with one type; every probe but
those in ``ONE_WAY`` the same shape in both; no metric or server-info field that SGLang lacks.

``tests/data/sglang-0.5.23-dialect.json`` holds real SGLang's shapes (recorded by
``tests/real_sglang/test_contract_diff.py`` with ``RAYSPEC_RECORD_DIALECT=1``), so the twin is
checked against them on every run, real SGLang or not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from rayspec.bench import StreamClient
from rayspec.bench import parse_metrics
from rayspec.engines.sglang import parse_startup_summary
from rayspec.server import parse_decode_lines
from rayspec.server._backends import _PROBE_LINE

RECORDED = Path(__file__).parent / "data" / "sglang-0.5.23-dialect.json"
# The servers compared: the tiny models, without speculation and with an EAGLE-3 chain, as the
# shared real runs start them (tests/real_sglang: target_flags, eagle_flags(CHAIN), CPU_FLAGS);
# the twin test without real SGLang starts the twin with these (it takes SGLang's flags, and
# TWIN_FLAGS of its own to skip pacing).
EAGLE3 = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3")  # fmt: skip
# The always-agreeing pair's (tests/real_sglang: AGREE): its every token is token 0, a special
# token with no text; the twin answers so with --twin-text pad (TEXTLESS_FLAGS).
AGREE_EAGLE3 = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4")  # fmt: skip
TEXTLESS_FLAGS = ("--twin-text", "pad")
MODES = ("plain", "spec", "agree")  # the compared servers (recorded shapes, by mode)
CPU_FLAGS = ("--device", "cpu", "--disable-overlap-schedule", "--max-total-tokens", "4096",
             "--sleep-on-idle", "--enable-metrics", "--dtype", "bfloat16",
             "--attention-backend", "intel_amx")  # fmt: skip
TWIN_FLAGS = ("--twin-realtime", "false")
PROMPT = "The red model verifies the draft tree"
MAX_TOKENS = 24  # per request; ten requests after the flush: past a 40-iteration decode-log window
TIMEOUT_S = 240.0
READY_LINE = "The server is fired up and ready to roll!"

# What rayspec reads, by probe: paths of flatten(); "[]" is any element of a list. Each is
# read by the code named beside it; a path read only with speculation is in SPEC_READS. Not
# here: the failure texts classify_failure reads (the real-fault tests start those failures)
# and the version preflight takes from the server's interpreter, not over HTTP.
READS: dict[str, tuple[str, ...]] = {
    # bench/_client.py StreamClient._on_chunk (endpoint "generate")
    "generate_stream.chunk": (
        "meta_info.completion_tokens",
        "meta_info.prompt_tokens",
        "meta_info.finish_reason",
    ),
    "generate_stream.final": (
        "meta_info.completion_tokens",
        "meta_info.prompt_tokens",
        "meta_info.finish_reason.type",
        "meta_info.e2e_latency",
        "output_ids",
        "output_ids[]",
    ),
    # bench/_client.py StreamClient._on_chunk (endpoint "completions")
    "completions_stream.content": (
        "choices[].text",
        "choices[].finish_reason",
        "usage.completion_tokens",
        "usage.prompt_tokens",
    ),
    "completions_stream.final": ("choices[].finish_reason", "usage.completion_tokens"),
    "completions_stream.usage": ("choices", "usage.completion_tokens", "usage.prompt_tokens"),
    # bench/_runner.py afetch_server_view, server/_backends.py _server_info
    "get_server_info": ("internal_states", "internal_states[].last_gen_throughput"),
    "server_info": ("internal_states", "internal_states[].last_gen_throughput"),
    # server/_backends.py wait_ready, flush_cache; bench/_runner.py flush_cache
    "health_generate": ("status",),
    "flush_cache": ("status", "text"),
    # tune/_trial.py _server_view (via bench/_runner.py parse_metrics; the keys: SGLANG.metrics)
    "metrics": ("sglang:gen_throughput",),
    # engines/sglang/_logparse.py parse_decode_lines, parse_startup_summary
    # (tune/_trial.py _server_view)
    "log.decode": (
        "running_req",
        "num_tokens",
        "token_usage",
        "gen_throughput_tok_s",
        "queue_req",
        "graph",
        "timestamp",
    ),  # fmt: skip
    "log.startup": ("max_total_num_tokens", "max_running_requests", "context_len"),
    "log.ready": ("ready_line",),
    # server/_backends.py _PROBE_LINE (readiness probes left out of a failure's log tail)
    "log.access": ("probe_line",),
    # what StreamClient.measure makes of it all (the requests table)
    "client.generate": ("prompt_tokens", "completion_tokens", "ttft_ms", "output_ids"),
    "client.completions": ("prompt_tokens", "completion_tokens", "ttft_ms"),
    "client.chat": ("prompt_tokens", "completion_tokens", "ttft_ms"),
}
SPEC_READS: dict[str, tuple[str, ...]] = {
    "generate_stream.final": (
        "meta_info.spec_verify_ct", "meta_info.spec_correct_drafts_histogram[]"),
    "completions_stream.sglext": (
        "choices",
        "sglext.spec_tokens_details.spec_verify_ct",
        "sglext.spec_tokens_details.spec_correct_drafts_histogram[]",
    ),
    "get_server_info": ("internal_states[].avg_spec_accept_length",),
    "server_info": ("internal_states[].avg_spec_accept_length",),
    "metrics": ("sglang:spec_accept_length",),
    "log.decode": ("accept_len", "accept_rate"),
    "client.generate": ("spec_verify_ct", "accept_length", "accept_histogram"),
    "client.completions": ("spec_verify_ct", "accept_length", "accept_histogram"),
    "client.chat": ("spec_verify_ct", "accept_length", "accept_histogram"),
}  # fmt: skip


def server_flags(target: str, draft: str | None, eagle: tuple[str, ...] = EAGLE3) -> list[str]:
    """The flags of the compared server: ``draft`` given, EAGLE-3 (``eagle``) with it."""
    flags = ["--model-path", target, *CPU_FLAGS]
    if draft is not None:
        flags += [*eagle, "--speculative-draft-model-path", draft]
    return flags


def load_recorded() -> dict[str, dict[str, Shape]]:
    """Real SGLang's recorded shapes: ``{"plain": {probe: shape}, "spec": ..., "agree": ...}``."""
    data = json.loads(RECORDED.read_text())
    return {
        mode: {name: _normal(shape) for name, shape in data[mode].items()}
        for mode in MODES
        if mode in data
    }


def recordable(real: Mapping[str, Shape], twin: Mapping[str, Shape]) -> dict[str, Shape]:
    """Real shapes to record: whole, except the server info, of which only the paths the twin
    has too (enough to tell a field the twin invents later) and those rayspec reads."""
    read = {p for paths in READS.values() for p in paths} | {
        p for paths in SPEC_READS.values() for p in paths
    }
    out = dict(real)
    for name in ("get_server_info", "server_info"):
        keep = set(twin.get(name, {})) | read
        out[name] = {p: t for p, t in real.get(name, {}).items() if p in keep}
    return out


def record(mode: str, real: Mapping[str, Shape]) -> None:
    """Write ``real`` (see ``recordable``) as the recorded shapes of ``mode``."""
    data = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    data[mode] = dict(real)
    RECORDED.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")


def reads(spec: bool) -> dict[str, tuple[str, ...]]:
    out = dict(READS)
    if spec:
        for name, paths in SPEC_READS.items():
            out[name] = out.get(name, ()) + paths
    return out


# ----------------------------------------------------------------------------------- shapes

Shape = dict[str, list[str]]  # path -> sorted type names


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "object"


def flatten(value: Any, prefix: str = "") -> Shape:
    """``{path: [types]}`` of a JSON value: ``a.b`` for keys, ``a[]`` for any list element."""
    found: dict[str, set[str]] = {}

    def walk(item: Any, path: str) -> None:
        if path:
            found.setdefault(path, set()).add(_type(item))
        if isinstance(item, dict):
            for key, sub in item.items():
                walk(sub, f"{path}.{key}" if path else str(key))
        elif isinstance(item, list):
            for sub in item:
                walk(sub, f"{path}[]")

    walk(value, prefix)
    return {path: sorted(types) for path, types in found.items()}


# A completion's top_logprobs are maps keyed by token text: one shape whatever the tokens.
_TOKEN_KEYS = re.compile(r"(logprobs\.top_logprobs\[\])\..*$")


def _normal(shape: Shape) -> Shape:
    out: dict[str, set[str]] = {}
    for path, types in shape.items():
        out.setdefault(_TOKEN_KEYS.sub(r"\1.<token>", path), set()).update(types)
    return {path: sorted(types) for path, types in out.items()}


def shapes(answers: Mapping[str, Any]) -> dict[str, Shape]:
    return {name: _normal(flatten(value)) for name, value in answers.items()}


def _compatible(a: list[str], b: list[str]) -> bool:
    """Same type, where null (a field unset this time) matches anything."""
    x, y = set(a) - {"null"}, set(b) - {"null"}
    return not x or not y or x == y


@dataclasses.dataclass(frozen=True)
class Diff:
    """Paths of one probe's answers: only in real SGLang's, only in the twin's, or in both
    with different types."""

    only_real: tuple[str, ...]
    only_twin: tuple[str, ...]
    mistyped: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.only_real) + len(self.only_twin) + len(self.mistyped)


def diff(real: Shape, twin: Shape) -> Diff:
    return Diff(
        only_real=tuple(sorted(set(real) - set(twin))),
        only_twin=tuple(sorted(set(twin) - set(real))),
        mistyped=tuple(
            sorted(p for p in set(real) & set(twin) if not _compatible(real[p], twin[p]))
        ),  # fmt: skip
    )


# Probes whose whole shape must match; the others are checked one way (below). Left out:
# /server_info (SGLang's ~550 server arguments; the twin has those it resolves), /metrics
# (SGLang's ~70 series; the twin has those it models).
ONE_WAY = frozenset({"get_server_info", "server_info", "metrics"})
TWIN_ONLY_OK = {  # prefixes of paths only the twin has, by design
    "get_server_info": ("rayspec_twin",),  # its own section
    "server_info": ("rayspec_twin",),
    "log.startup": ("available_gpu_mem_gb",),  # a GPU node's; this CPU's is available_cpu_mem
    # The twin's simulated clock (docs/sglang.md, "The twin's own fields"): never read from
    # a real server.
    "generate": ("meta_info.rayspec_twin",),
    "generate_stream.chunk": ("meta_info.rayspec_twin",),
    "generate_stream.final": ("meta_info.rayspec_twin",),
}


# Paths only real SGLang has, by design: its prefix cache's hits (the twin has no prefix cache:
# cached_tokens is 0, and SGLang sends cached_tokens_details null then).
REAL_ONLY_OK = ("cached_tokens_details.",)


def _twin_only_ok(name: str, path: str) -> bool:
    """Whether ``path`` of probe ``name`` is one only the twin has, by design (every /generate
    answer's simulated clock, wherever the answer sits in the probe)."""
    if name.startswith("generate") and "meta_info.rayspec_twin" in path:
        return True
    return path.startswith(TWIN_ONLY_OK.get(name, ()))


def problems(real: Mapping[str, Shape], twin: Mapping[str, Shape], spec: bool) -> list[str]:
    """Where the twin's shapes break the contract with real SGLang's, one line each."""
    out = []
    for name, paths in reads(spec).items():
        a, b = real.get(name, {}), twin.get(name, {})
        for path in paths:
            if path not in a or path not in b:
                where = " and ".join(w for w, f in (("real", a), ("twin", b)) if path not in f)
                out.append(f"{name}: {path} (read by rayspec) missing in {where}")
            elif not _compatible(a[path], b[path]):
                out.append(f"{name}: {path} (read by rayspec) is {a[path]} in real, {b[path]} "
                           "in the twin")  # fmt: skip
    for name in sorted(set(real) | set(twin)):
        d = diff(real.get(name, {}), twin.get(name, {}))
        invented = [p for p in d.only_twin if not _twin_only_ok(name, p)]
        if name in ONE_WAY:
            if invented or d.mistyped:
                out.append(f"{name}: twin-only {invented}, mistyped {list(d.mistyped)}")
        else:
            missing = [p for p in d.only_real if not any(ok in p for ok in REAL_ONLY_OK)]
            if missing or invented or d.mistyped:
                out.append(f"{name}: real-only {missing}, twin-only {invented}, "
                           f"mistyped {list(d.mistyped)}")  # fmt: skip
    return out


def diff_counts(
    real: Mapping[str, Shape], twin: Mapping[str, Shape]
) -> dict[str, tuple[int, ...]]:
    """``{probe: (real-only, twin-only, mistyped)}`` for every probe that differs."""
    out = {}
    for name in sorted(set(real) | set(twin)):
        d = diff(real.get(name, {}), twin.get(name, {}))
        if d.count:
            out[name] = (len(d.only_real), len(d.only_twin), len(d.mistyped))
    return out


# ----------------------------------------------------------------------------------- probes


def _sse(client: httpx.Client, path: str, body: Mapping[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=dict(body)) as response:
        response.raise_for_status()
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip


def _role(chunk: dict[str, Any]) -> str:
    if chunk.get("choices"):
        choice = chunk["choices"][0]
        if choice.get("finish_reason"):
            return "final"
        delta = choice.get("delta") or {}
        return "role" if "role" in delta else "content"
    if "error" in chunk:
        return "error"
    if chunk.get("sglext"):
        return "sglext"
    return "usage" if chunk.get("usage") else "empty"


def _by_role(chunks: list[Any], name: str) -> dict[str, Any]:
    """The stream's chunks by role (the first of each; ``order``: the roles, repeats merged)."""
    out: dict[str, Any] = {}
    order: list[str] = []
    for chunk in chunks:
        role = _role(chunk)
        out.setdefault(f"{name}.{role}", chunk)
        if not order or order[-1] != role:
            order.append(role)
    out[f"{name}.order"] = {f"order {' '.join(order)}": True}  # the order is the shape
    return out


def _record(url: str, endpoint: str) -> dict[str, Any]:
    """What rayspec's own client records of one request (the fields it set, by name)."""

    async def one() -> Any:
        async with StreamClient(url, endpoint=endpoint, read_timeout_s=TIMEOUT_S) as client:
            return await client.measure(PROMPT, MAX_TOKENS, scenario="s", run=0, index=0,
                                        concurrency=1)  # fmt: skip

    record = asyncio.run(one())
    assert record.ok, f"{endpoint}: {record.error}"
    # category is the caller's (the prompt's), never the server's: not part of the dialect
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(record).items()
            if v is not None and k != "category"}  # fmt: skip


PAST_CONTEXT = 5_000_000  # an output budget past any context length


def _ctype(r: httpx.Response) -> str:
    return r.headers.get("content-type", "none").split(";")[0].strip()


def _answer(r: httpx.Response) -> dict[str, Any]:
    """An answer as its shape is compared: the status and content type are its key."""
    try:
        body: Any = r.json()
    except ValueError:
        body = {"text": r.text}
    return {f"{r.status_code} {_ctype(r)}": body}


def _orders(chunks: list[Any]) -> str:
    """A stream's chunk roles per choice index (repeats merged), then the trailing chunks'."""
    per: dict[str, list[str]] = {}
    for chunk in chunks:
        if isinstance(chunk, dict) and "error" in chunk:
            where, role = "tail", "error"
        else:
            choices = chunk.get("choices") or []
            where = str(choices[0].get("index", 0)) if choices else "tail"
            role = _role(chunk)
        seq = per.setdefault(where, [])
        if not seq or seq[-1] != role:
            seq.append(role)
    return "; ".join(f"{k}: {' '.join(v)}" for k, v in sorted(per.items()))


def _stream_answer(c: httpx.Client, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A streamed answer: its status and content type as the key, then its chunks and their
    order (a refusal before the stream starts is a plain JSON answer)."""
    with c.stream("POST", path, json=dict(body)) as r:
        key = f"{r.status_code} {_ctype(r)}"
        if _ctype(r) != "text/event-stream":
            r.read()
            return _answer(r)
        lines = list(r.iter_lines())
    chunks = [
        json.loads(ln[6:]) for ln in lines if ln.startswith("data: ") and ln != "data: [DONE]"
    ]
    done = "data: [DONE]" in lines
    return {key: {"chunks": chunks, f"order {_orders(chunks)}": True, "done": done}}


def _id_form(value: Any) -> str:
    """How an answer's id is made: SGLang's are the request's 32-hex-digit id."""
    text = str(value)
    return (
        "hex32" if re.fullmatch(r"[0-9a-f]{32}", text) else re.sub(r"[0-9a-f]{6,}", "<hex>", text)
    )


def edge_probes(c: httpx.Client) -> dict[str, Any]:
    """The error and edge answers: every layer's refusal, budgets past the context length
    (also streamed), ``n: 2``, logprobs, the answers' id forms, ``/v1/loads``,
    ``/model_info``, the context length ``/v1/models`` reports, 404, 405."""
    out: dict[str, Any] = {}
    greedy = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    messages = [{"role": "user", "content": PROMPT}]
    oa = {"model": "default", "temperature": 0, "max_tokens": 4, "ignore_eos": True}
    chat = {**oa, "messages": messages}
    comp = {**oa, "prompt": PROMPT}
    out["not_found"] = _answer(c.get("/no/such/path"))
    out["method_not_allowed"] = _answer(c.get("/generate"))
    out["loads"] = _answer(c.get("/v1/loads"))
    out["model_info"] = _answer(c.get("/model_info"))
    out["model_card_unknown"] = _answer(c.get("/v1/models/no-such-model"))
    flush = c.post("/flush_cache")
    out["flush_cache_type"] = {f"{flush.status_code} {_ctype(flush)}": True}
    card = c.get("/v1/models").json()["data"][0]
    out["models_context"] = {f"max_model_len {card['max_model_len']}": True}

    def gen(body: Any, *, raw: bytes | None = None) -> dict[str, Any]:
        if raw is not None:
            return _answer(c.post("/generate", content=raw,
                                  headers={"content-type": "application/json"}))  # fmt: skip
        return _answer(c.post("/generate", json=body))

    def sampling(**params: Any) -> dict[str, Any]:
        return {"text": PROMPT, "sampling_params": {**greedy, **params}}

    out["generate_no_prompt"] = gen({"sampling_params": greedy})
    out["generate_negative_budget"] = gen(sampling(max_new_tokens=-1))
    out["generate_past_context"] = gen(sampling(max_new_tokens=PAST_CONTEXT))
    out["generate_past_context_stream"] = _stream_answer(
        c, "/generate", {**sampling(max_new_tokens=PAST_CONTEXT), "stream": True})  # fmt: skip
    out["generate_negative_budget_stream"] = _stream_answer(
        c, "/generate", {**sampling(max_new_tokens=-1), "stream": True})  # fmt: skip
    out["generate_float_budget"] = gen(sampling(max_new_tokens=8.5))
    out["generate_integer_stop"] = gen(sampling(stop=5))
    out["generate_unknown_param"] = gen(sampling(bogus=1))
    out["generate_negative_temperature"] = gen(sampling(temperature=-1))
    out["generate_bad_json"] = gen(None, raw=b"{bad")
    out["generate_not_object"] = gen([1, 2])
    out["generate_text_not_string"] = gen({"text": 5, "sampling_params": greedy})
    out["generate_logprob"] = gen({**sampling(), "return_logprob": True, "top_logprobs_num": 2})
    out["generate_n2"] = gen(sampling(n=2))

    def post(path: str, body: Any) -> dict[str, Any]:
        return _answer(c.post(path, json=body))

    for name, path, base in (("completions", "/v1/completions", comp),
                             ("chat", "/v1/chat/completions", chat)):  # fmt: skip
        out[f"{name}_negative_budget"] = post(path, {**base, "max_tokens": -1})
        out[f"{name}_past_context"] = post(path, {**base, "max_tokens": PAST_CONTEXT})
        out[f"{name}_past_context_stream"] = _stream_answer(
            c, path, {**base, "max_tokens": PAST_CONTEXT, "stream": True})  # fmt: skip
        out[f"{name}_n2"] = post(path, {**base, "n": 2})
        out[f"{name}_n2_stream"] = _stream_answer(c, path, {**base, "n": 2, "stream": True})
    out["completions_no_prompt"] = post("/v1/completions", oa)
    out["completions_logprobs"] = post("/v1/completions", {**comp, "logprobs": 2})
    out["completions_logprobs_stream"] = _stream_answer(
        c, "/v1/completions", {**comp, "logprobs": 1, "stream": True})  # fmt: skip
    out["chat_bad_role"] = post(
        "/v1/chat/completions", {**oa, "messages": [{"role": "wizard", "content": PROMPT}]}
    )
    out["chat_empty_messages"] = post("/v1/chat/completions", {**oa, "messages": []})
    out["chat_no_messages"] = post("/v1/chat/completions", oa)
    out["chat_logprobs"] = post("/v1/chat/completions",
                                {**chat, "logprobs": True, "top_logprobs": 2})  # fmt: skip
    out["chat_logprobs_stream"] = _stream_answer(
        c, "/v1/chat/completions", {**chat, "logprobs": True, "stream": True})  # fmt: skip
    ids: dict[str, bool] = {}
    for path, base in (("/v1/completions", comp), ("/v1/chat/completions", chat)):
        ids[f"{path} {_id_form(c.post(path, json=base).json()['id'])}"] = True
        with c.stream("POST", path, json={**base, "stream": True}) as r:
            line = next(ln for ln in r.iter_lines() if ln.startswith("data: {"))
        ids[f"{path} stream {_id_form(json.loads(line[6:])['id'])}"] = True
    out["id_forms"] = ids
    return out


def probe(base_url: str) -> dict[str, Any]:
    """Send every request of the contract to a ready server; the answers by probe name."""
    out: dict[str, Any] = {}
    greedy = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S, trust_env=False) as c:
        r = c.get("/health_generate")
        out["health_generate"] = {"status": r.status_code}
        r = c.post("/flush_cache")
        out["flush_cache"] = {"status": r.status_code, "text": r.text.split(".")[0]}
        # rayspec's own client first (the decode-log window and the lifetime accept length
        # need tokens generated since the flush), then the raw forms.
        out["client.generate"] = _record(base_url, "generate")
        out["client.completions"] = _record(base_url, "completions")
        out["client.chat"] = _record(base_url, "chat")
        body = {"text": PROMPT, "sampling_params": greedy}
        out["generate"] = c.post("/generate", json=body).json()
        chunks = _sse(c, "/generate", {**body, "stream": True})
        out["generate_stream.chunk"] = chunks[0]
        out["generate_stream.final"] = chunks[-1]
        openai = {"model": "default", "max_tokens": MAX_TOKENS, "temperature": 0,
                  "ignore_eos": True, "return_spec_tokens_details": True}  # fmt: skip
        usage = {"stream": True, "stream_options": {"include_usage": True}}
        continuous = {
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        # StreamClient's own payload (continuous usage), then the plain include_usage form.
        chunks = _sse(c, "/v1/completions", {**openai, "prompt": PROMPT, **continuous})
        out |= _by_role(chunks, "completions_stream")
        chunks = _sse(c, "/v1/completions", {**openai, "prompt": PROMPT, **usage})
        out |= _by_role(chunks, "completions_stream_usage")
        messages = [{"role": "user", "content": PROMPT}]
        chunks = _sse(c, "/v1/chat/completions", {**openai, "messages": messages, **usage})
        out |= _by_role(chunks, "chat_stream")
        out["completions"] = c.post("/v1/completions", json={**openai, "prompt": PROMPT}).json()
        out["chat_completions"] = c.post(
            "/v1/chat/completions", json={**openai, "messages": messages}).json()  # fmt: skip
        out["models"] = c.get("/v1/models").json()
        out["tokenize_prompt"] = c.post("/tokenize", json={"prompt": PROMPT}).json()
        out["tokenize_messages"] = c.post("/tokenize", json={"messages": messages}).json()
        ids = out["generate"]["output_ids"]
        out["detokenize"] = c.post(
            "/detokenize", json={"tokens": ids, "skip_special_tokens": False}).json()  # fmt: skip
        info = c.get("/get_server_info").json()
        out["get_server_info"] = info
        out["server_info"] = c.get("/server_info").json()
        out["metrics"] = {name: "metric" for name in parse_metrics(c.get("/metrics").text)}
        out |= edge_probes(c)
    return out


def answers(base_url: str, log_path: Path) -> dict[str, Any]:
    """The probe's answers and the log lines rayspec parses, of one ready server."""
    return probe(base_url) | log_answers(log_path)


def log_answers(log_path: Path) -> dict[str, Any]:
    """The log lines rayspec parses, as the fields its parsers found (None fields left out)."""
    text = log_path.read_text(errors="replace")
    decode = parse_decode_lines(text)
    summary = parse_startup_summary(text)
    return {
        "log.decode": {k: v for k, v in dataclasses.asdict(decode[-1]).items() if v is not None}
        if decode
        else {},
        "log.startup": {k: v for k, v in dataclasses.asdict(summary).items() if v is not None}
        if summary
        else {},
        "log.ready": {"ready_line": True} if READY_LINE in text else {},
        "log.access": _access_lines(text),
    }


def _access_lines(text: str) -> dict[str, bool]:
    """The access-log lines of the readiness probes: rayspec's filter finds them; SGLang
    0.5.23 stamps them like its own lines (present keys are the shape)."""
    lines = [ln for ln in text.splitlines() if '"GET /health_generate HTTP/1.1"' in ln]
    out = {}
    if lines and all(_PROBE_LINE.search(ln) for ln in lines):
        out["probe_line"] = True
    if lines and all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO: ", ln) for ln in lines):
        out["stamped"] = True
    return out
