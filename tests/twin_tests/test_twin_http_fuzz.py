"""The twin's HTTP face under generated traffic (issue 33, the suites widened): bodies, budgets,
stop strings and encodings, against the server ``python -m rayspec.twin.server`` builds, on
this process's event loop (``_inproc``), with EAGLE-3 on and a 512-token context.

Invariants, for every case:

1. never a 5xx: 200, or 400/404/405 as SGLang 0.5.23 answers;
2. every refusal in one of the shapes SGLang gives at that endpoint (``_REFUSALS``, as
   recorded from the real server; the OpenAI endpoints only ``ErrorResponse``), its ``code``
   the status;
3. an answer within its budget and the context length; a stream of ``data:`` JSON lines ending
   with ``[DONE]`` (an error chunk only on ``/generate``);
4. the event loop never held more than 100 ms (the CPU this thread spent between two wakes of
   a probe task on the same loop);
5. memory bounded: under 64 MiB traced at the peak of a case;
6. the engine idle again after each case (nothing left running or queued).

Seeded and bounded as the config fuzz: ``derandomize`` unless ``RAYSPEC_FUZZ_SEED``;
``RAYSPEC_FUZZ_EXAMPLES`` sets the examples per test (default below). The counts of cases and
how they ended are printed at the end of the session (``conftest.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import seed
from hypothesis import settings
from hypothesis import strategies as st

from tests.twin_tests._inproc import LagProbe
from tests.twin_tests._inproc import serving

from .conftest import SPEC_ARGS

EXAMPLES = int(os.environ.get("RAYSPEC_FUZZ_EXAMPLES", "60"))
SEED = os.environ.get("RAYSPEC_FUZZ_SEED")
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=SEED is None,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
seeded = seed(int(SEED)) if SEED is not None else (lambda f: f)
CONTEXT = 512
# A case may generate up to the context; on a loaded 2-core machine the suite's 300 s per test is
# not enough for 150 of them.
pytestmark = pytest.mark.timeout(900)
ARGS = (*SPEC_ARGS, "--twin-realtime", "false", "--context-length", str(CONTEXT))
MAX_LAG_S = 0.1
MAX_TRACED = 64 * 2**20

COUNTS: Counter[str] = Counter()  # how the cases ended (printed by conftest.py)
HELD_MS: list[float] = []  # the longest CPU hold of the loop in any case (printed beside them)
INVARIANTS = 6

# SGLang's refusal bodies (tests/data/sglang-0.5.23-dialect.json's error probes), by key set.
_OPENAI_ERROR = frozenset({"object", "message", "type", "param", "code"})
_REFUSALS = {
    "/generate": ({"error"}, _OPENAI_ERROR),
    "/v1/completions": (_OPENAI_ERROR,),
    "/v1/chat/completions": (_OPENAI_ERROR,),
    "/tokenize": (_OPENAI_ERROR,),
    "/detokenize": (_OPENAI_ERROR,),
    "/set_internal_state": (_OPENAI_ERROR,),
}
_ANSWERED = ("/generate", "/v1/completions", "/v1/chat/completions")  # answers checked (3)
_GENERATE_KEYS = ("text", "input_ids", "sampling_params", "stream", "rid", "return_logprob",
                  "top_logprobs_num")  # fmt: skip
_SAMPLING_KEYS = ("max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature",
                  "top_p", "top_k", "min_p", "ignore_eos", "no_stop_trim", "n",
                  "bogus")  # fmt: skip
_OPENAI_KEYS = ("model", "max_tokens", "max_completion_tokens", "stop", "stream", "n",
                "temperature", "ignore_eos", "logprobs", "top_logprobs", "stream_options",
                "min_tokens", "stop_token_ids", "return_spec_tokens_details")  # fmt: skip


# ---------------------------------------------------------------------------------- strategies

_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
_budget = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 16, CONTEXT - 8, CONTEXT - 1, CONTEXT, CONTEXT + 1,
                     5_000_000, 2**63 - 1, 2**63, 2**64, 10**30]),
    st.integers(-5, 300),
    st.sampled_from([1.0, 1.5, 1e12, "8", None, True, [], {}]),
)  # fmt: skip
_stop = st.one_of(
    _text,
    st.lists(_text, max_size=8),
    # Near SGLang's cap of 1,024 stop strings, and one very long one (built, not drawn: a
    # drawn 1,000-element list costs hypothesis a second).
    st.tuples(st.integers(900, 1100), _text).map(lambda t: [f"{t[1]}{i}" for i in range(t[0])]),
    st.tuples(st.integers(2000, 10_000), st.sampled_from("ké日 ")).map(lambda t: [t[1] * t[0]]),
    st.sampled_from(["ka", " ", "[EOS]", "zz-never", 5, [1, "a"], None]),
)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), _text,
)  # fmt: skip
_value = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


def _params() -> st.SearchStrategy[dict[str, Any]]:
    special = {"max_new_tokens": _budget, "stop": _stop}
    keys = st.sets(st.sampled_from(_SAMPLING_KEYS), max_size=6)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: special.get(k, _value) for k in ks}))


def _prompt() -> st.SearchStrategy[Any]:
    words = st.lists(st.sampled_from(["ka", "lo", "mi", "the", "é", "日本"]), max_size=60)
    return st.one_of(words.map(" ".join), _text, st.just(" ".join(["w"] * (CONTEXT + 5))), _value)


def _generate_body() -> st.SearchStrategy[Any]:
    base = st.fixed_dictionaries(
        {"text": _prompt(), "sampling_params": _params() | st.lists(_params(), max_size=2)},
        optional={k: _value for k in _GENERATE_KEYS if k not in ("text", "sampling_params")},
    )
    return base | st.dictionaries(st.sampled_from(_GENERATE_KEYS), _value, max_size=4)


def _openai_body(chat: bool) -> st.SearchStrategy[Any]:
    role = st.sampled_from(["user", "system", "assistant", "USER", "wizard", None, 5])
    message = st.fixed_dictionaries({"role": role, "content": _prompt()}) | _value
    head = {"messages": st.lists(message, max_size=3) | _value} if chat else {"prompt": _prompt()}
    optional = {k: _budget if "tokens" in k else _stop if k == "stop" else _value
                for k in _OPENAI_KEYS}  # fmt: skip
    optional["stream"] = st.booleans() | _value
    return st.fixed_dictionaries(head, optional=optional)


def _raw() -> st.SearchStrategy[tuple[bytes, str]]:
    """Bodies as bytes with a content type: the encodings a JSON parser meets."""
    good = json.dumps({"text": "a b", "sampling_params": {"max_new_tokens": 3}}).encode()
    bodies = st.sampled_from([
        b"", b"{", b"{bad", b"null", b"[]", b"\xff\xfe{}", b"\xef\xbb\xbf" + good,
        good.replace(b"a b", b"\xed\xa0\x80"),  # a lone surrogate, as UTF-8 bytes
        b'{"text": "\\ud800", "sampling_params": {"max_new_tokens": 2}}',
        b"[" * 100_000 + b"]" * 100_000, b'{"text": "x", "sampling_params": ' * 2000,
        b'{"text": "a", "sampling_params": {"max_new_tokens": 1e999}}', good, good * 2,
        b'{"text": "a", "sampling_params": {"max_new_tokens": NaN}}',
    ]) | st.binary(max_size=200)  # fmt: skip
    types = st.sampled_from(["application/json", "application/json; charset=latin-1",
                             "text/plain", "application/x-www-form-urlencoded", ""])  # fmt: skip
    return st.tuples(bodies, types)


# ---------------------------------------------------------------------------------- the harness


class _Env:
    """One event loop running one twin's HTTP side, a lag probe and tracemalloc."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._serving = serving(ARGS)
        self.server, self.client = self.loop.run_until_complete(self._serving.__aenter__())
        self.probe = LagProbe()
        self.loop.run_until_complete(self._enter_probe())

    async def _enter_probe(self) -> None:
        self.probe.__enter__()

    def close(self) -> None:
        self.probe.__exit__()
        self.loop.run_until_complete(self._serving.__aexit__(None, None, None))
        self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def env() -> Iterator[_Env]:
    tracemalloc.start()
    e = _Env()
    try:
        yield e
    finally:
        e.close()
        tracemalloc.stop()


async def _send(
    env: _Env, method: str, path: str, body: Any = None, raw: tuple[bytes, str] | None = None
) -> tuple[int, str | None, bytes]:
    kwargs: dict[str, Any] = {}
    if raw is not None:
        kwargs["data"] = raw[0]
        kwargs["headers"] = {"Content-Type": raw[1]} if raw[1] else {}
    elif body is not None:
        kwargs["data"] = json.dumps(body, allow_nan=True).encode()
        kwargs["headers"] = {"Content-Type": "application/json"}
    resp = await env.client.request(method, path, **kwargs)
    data = await resp.read()
    ctype = resp.headers.get("Content-Type")
    return resp.status, ctype.split(";")[0] if ctype else None, data


def _check_refusal(path: str, status: int, data: bytes) -> str:
    body = json.loads(data)
    assert isinstance(body, dict), body
    if status in (404, 405):
        assert set(body) == {"detail"} and isinstance(body["detail"], str), body
        return f"{status} detail"
    assert status == 400, (status, body)
    keys = frozenset(body)
    assert keys in {frozenset(k) for k in _REFUSALS[path]}, (path, body)
    if keys == _OPENAI_ERROR:
        assert body["object"] == "error" and body["code"] == status and body["param"] is None
        assert isinstance(body["message"], str) and body["message"]
        assert body["type"] in ("Bad Request", "BadRequestError", "BadRequest"), body
        return f"400 {body['type']}"
    error = body["error"]
    if isinstance(error, dict):
        assert set(error) == {"message"} and isinstance(error["message"], str), body
        return "400 generate error"
    assert isinstance(error, str) and error, body
    return "400 contract"


def _budget_of(path: str, body: Any) -> int | None:
    """The budget a served request asked for (None: no limit named, or several)."""
    if not isinstance(body, dict):
        return None
    if path == "/generate":
        sp = body.get("sampling_params")
        value = sp.get("max_new_tokens", 128) if isinstance(sp, dict) else None
    elif path == "/v1/completions":
        value = body.get("max_tokens", 16)
        value = 16 if value is None else value
    else:
        value = body.get("max_completion_tokens")
        value = body.get("max_tokens") if value is None else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_answer(path: str, body: Any, ctype: str | None, data: bytes) -> str:
    budget = _budget_of(path, body)
    if ctype == "text/event-stream":
        text = data.decode()
        lines = [ln for ln in text.split("\n") if ln]
        assert lines and lines[-1] == "data: [DONE]", text[-300:]
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert all(ln.startswith("data: ") for ln in lines), text[:300]
        errors = [c for c in chunks if "error" in c]
        assert not errors or (path == "/generate" and len(chunks) == 1), chunks[:2]
        tokens = [c["meta_info"]["completion_tokens"] for c in chunks if "meta_info" in c]
        if tokens and budget is not None:
            assert max(tokens) <= budget
        return "200 stream error" if errors else "200 stream"
    out = json.loads(data)
    answers = out if isinstance(out, list) else [out]
    for a in answers:
        used = a["meta_info"]["completion_tokens"] if "meta_info" in a else None
        if "usage" in a:
            used = a["usage"]["completion_tokens"] // max(1, len(a["choices"]))
            assert a["usage"]["total_tokens"] <= CONTEXT * len(a["choices"])
        if used is not None and budget is not None:
            assert used <= budget, (used, budget)
        if "meta_info" in a:
            assert a["meta_info"]["prompt_tokens"] + used <= CONTEXT
    return "200"


def _case(
    env: _Env, method: str, path: str, body: Any = None, raw: tuple[bytes, str] | None = None
) -> None:
    async def go() -> tuple[int, str | None, bytes]:
        env.probe.reset()
        result = await _send(env, method, path, body, raw)
        for _ in range(200):  # aborted or refused requests leave the engine at once
            if env.server.engine.idle:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(2 * env.probe.period_s)  # one more probe wake after the case
        return result

    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    status, ctype, data = env.run(go())
    _, peak = tracemalloc.get_traced_memory()
    assert status < 500, (status, data[:300])  # 1
    if status == 200:  # 3
        outcome = _check_answer(path, body, ctype, data) if path in _ANSWERED else "200"
    else:
        outcome = _check_refusal(path, status, data) if status in (400, 404, 405) else str(status)
        assert status in (400, 404, 405), (status, data[:300])  # 2
    assert env.probe.max_lag_s < MAX_LAG_S, (  # 4
        f"loop held {env.probe.max_lag_s * 1000:.0f} ms ({path}, {outcome})"
    )
    assert peak - before < MAX_TRACED, f"{(peak - before) / 2**20:.0f} MiB ({path})"  # 5
    assert env.server.engine.idle, "requests left running"  # 6
    COUNTS[f"{path} {outcome}"] += 1
    HELD_MS[:] = [max([*HELD_MS, env.probe.max_lag_s * 1000])]


# ---------------------------------------------------------------------------------- the tests


@seeded
@FUZZ
@given(body=_generate_body())
def test_generate_bodies(env: _Env, body: Any) -> None:
    _case(env, "POST", "/generate", body)


@seeded
@FUZZ
@given(chat=st.booleans(), data=st.data())
def test_openai_bodies(env: _Env, chat: bool, data: st.DataObject) -> None:
    body = data.draw(_openai_body(chat))
    _case(env, "POST", "/v1/chat/completions" if chat else "/v1/completions", body)


@seeded
@FUZZ
@given(
    path=st.sampled_from(["/generate", "/v1/completions", "/v1/chat/completions"]),
    budget=_budget,
    stop=_stop,
    stream=st.booleans(),
    min_new=st.sampled_from([None, 0, 3, CONTEXT]),
)
def test_budgets_and_stop_strings(
    env: _Env, path: str, budget: Any, stop: Any, stream: bool, min_new: Any
) -> None:
    if path == "/generate":
        params = {"max_new_tokens": budget, "stop": stop, "ignore_eos": True}
        if min_new is not None:
            params["min_new_tokens"] = min_new
        body: dict[str, Any] = {"text": "ka lo mi", "sampling_params": params, "stream": stream}
    else:
        body = {"model": "m", "max_tokens": budget, "stop": stop, "stream": stream,
                "ignore_eos": True}  # fmt: skip
        body |= {"messages": [{"role": "user", "content": "ka lo"}]} if "chat" in path else {
            "prompt": "ka lo"}  # fmt: skip
    _case(env, "POST", path, body)


@seeded
@FUZZ
@given(
    path=st.sampled_from(["/generate", "/v1/completions", "/v1/chat/completions", "/tokenize",
                          "/detokenize", "/set_internal_state"]),
    raw=_raw(),
)  # fmt: skip
def test_encodings(env: _Env, path: str, raw: tuple[bytes, str]) -> None:
    _case(env, "POST", path, raw=raw)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/no/such/path"), ("GET", "/generate"), ("POST", "/health"), ("PUT", "/v1/models"),
     ("DELETE", "/flush_cache"), ("GET", "/v1/loads"), ("GET", "/model_info")],
)  # fmt: skip
def test_routes(env: _Env, method: str, path: str) -> None:
    _case(env, method, path)
