"""SGLang's native ``/generate`` for the twin: cumulative SSE chunks with ``meta_info``.

A request is checked as SGLang 0.5.23 checks it, in its order, each refusal in its layer's
shape (:mod:`rayspec.twin._replies`): the request model (the body and its top-level types),
then the JSON contract of ``sampling_params`` (from 0.5.22: every key known, every value of its
type), then the tokenizer manager (a prompt, the context length, the sampling values), whose
refusal a stream answers as HTTP 200 with one ``{"error": ...}`` chunk.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from aiohttp import web

from rayspec.twin._ends import Stops
from rayspec.twin._engine import EngineDead
from rayspec.twin._engine import GenRequest
from rayspec.twin._logprobs import generate_fields
from rayspec.twin._replies import SSE_HEADERS
from rayspec.twin._replies import contract_error
from rayspec.twin._replies import generate_error
from rayspec.twin._replies import generate_stream_error
from rayspec.twin._replies import sse
from rayspec.twin._replies import type_issue
from rayspec.twin._replies import validation_error
from rayspec.twin._text import count_prompt_tokens
from rayspec.twin._text import delta_text

if TYPE_CHECKING:
    from rayspec.twin._app import TwinServer

# SGLang 0.5.23's sampling_params keys, in the order its contract error lists them.
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
_INTS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval", "sampling_seed",
         "beam_width")  # fmt: skip
_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
           "repetition_penalty")  # fmt: skip
_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_I64 = 2**63
MAX_BATCH = 4096  # prompts (times n) one request may carry


class Refused(Exception):
    """A request the tokenizer manager refuses (SGLang's ``ValueError``): its message."""


def _serde(value: Any) -> str:
    """How the JSON contract's decoder (serde) names a value it did not expect."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int) and -_I64 <= value < _I64:
        return f"integer `{value}`"
    if isinstance(value, int | float):
        return f"floating point `{float(value)!r}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    return "sequence" if isinstance(value, list) else "map"


def _is_i64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_I64 <= value < _I64


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def contract_problem(params: Mapping[str, Any], unknown_keys: bool = True) -> str | None:
    """What ``/generate``'s JSON contract says of one ``sampling_params`` object, or None
    (``unknown_keys``: an unknown key is refused, from SGLang 0.5.22)."""
    for key, value in params.items():
        if key not in SAMPLING_KEYS:
            if not unknown_keys:
                continue
            known = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            return f"unknown field `{key}`, expected one of {known}"
        if value is None:
            continue
        if key in _INTS and not _is_i64(value):
            return f"invalid type: {_serde(value)}, expected i64"
        if key in _FLOATS and not _is_number(value):
            return f"invalid type: {_serde(value)}, expected f64"
        if key in _BOOLS and not isinstance(value, bool):
            return f"invalid type: {_serde(value)}, expected a boolean"
        if key in ("stop", "stop_regex"):
            if isinstance(value, list):
                bad = next((v for v in value if not isinstance(v, str)), None)
                if bad is not None or any(v is None for v in value):
                    return f"invalid type: {_serde(bad)}, expected a string"
            elif not isinstance(value, str):
                return (
                    f"invalid type: {_serde(value)}, expected a value or an array of values "
                    "for StringOrList"
                )
        if key == "stop_token_ids":
            if not isinstance(value, list):
                return f"invalid type: {_serde(value)}, expected a sequence"
            bad = next((v for v in value if not _is_i64(v)), None)
            if bad is not None:
                return f"invalid type: {_serde(bad)}, expected i64"
    return None


def check_sampling(params: Mapping[str, Any]) -> None:
    """SGLang's ``SamplingParams.verify`` on the values the twin reads.

    Raises:
        Refused: a value out of its range (SGLang's message).
    """
    temperature = params.get("temperature")
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise Refused(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = params.get("top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise Refused(f"top_p must be in (0, 1], got {top_p}.")
    top_k = params.get("top_k")
    if top_k is not None and (top_k < 1 and top_k != -1):
        raise Refused(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    min_p = params.get("min_p")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise Refused(f"min_p must be in [0, 1], got {min_p}.")
    min_new = params.get("min_new_tokens") or 0
    if min_new < 0:
        raise Refused(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    max_new = params.get("max_new_tokens", 128)
    if max_new is not None:
        if max_new < 0:
            raise Refused(f"max_new_tokens must be at least 0, got {max_new}.")
        if min_new > max_new:
            raise Refused(
                f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."
            )


def _prompts(body: Mapping[str, Any]) -> tuple[list[str], list[int], bool] | list[str]:
    """The prompts' keys, their token counts and whether the body is a batch; or the
    request model's validation issues."""
    text: Any = body.get("text")
    input_ids: Any = body.get("input_ids")
    if text is not None:
        if isinstance(text, str):
            return [text], [count_prompt_tokens(text)], False
        if isinstance(text, list) and all(isinstance(t, str) for t in text):
            return list(text), [count_prompt_tokens(t) for t in text], True
        return [type_issue(("text", "str"), "str", text),
                type_issue(("text", "list[str]"), "list", text)]  # fmt: skip
    if input_ids is not None:
        if isinstance(input_ids, list) and all(_is_i64(i) for i in input_ids):
            return [json.dumps(input_ids)], [len(input_ids)], False
        if isinstance(input_ids, list) and all(
            isinstance(ids, list) and all(_is_i64(i) for i in ids) for ids in input_ids
        ):
            return [json.dumps(ids) for ids in input_ids], [len(ids) for ids in input_ids], True
        return [type_issue(("input_ids", "list[int]"), "list", input_ids)]
    return [], [], False


async def generate(srv: TwinServer, request: web.Request) -> web.StreamResponse:
    """``POST /generate`` (and ``PUT``)."""
    body, refused = await srv.json_body(request, "GenerateReqInput")
    if refused is not None:
        return refused
    found = _prompts(body)
    if isinstance(found, list):
        return validation_error(found)
    keys, counts, is_batch = found
    sp = body.get("sampling_params")
    if sp is None:
        sp = {}
    many = isinstance(sp, list) and all(isinstance(x, dict) for x in sp)
    if not (isinstance(sp, dict) or many):
        return validation_error([type_issue(("sampling_params", "dict[str,any]"), "dict", sp)])
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return validation_error([type_issue(("stream",), "bool", stream)])
    sps = sp if isinstance(sp, list) else [sp] * max(1, len(keys))
    for one in sps:  # the twin reads these values: their types are checked in every version
        problem = contract_problem(one, unknown_keys=srv.version >= (0, 5, 22))
        if problem is not None:
            return contract_error(problem)
    try:
        reqs = _submit_all(srv, body, keys, counts, sps)
    except Refused as exc:
        if stream:  # SGLang's stream starts before the check: 200, one error chunk
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(generate_stream_error(str(exc)))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return generate_error(str(exc))
    is_batch = is_batch or len(reqs) > 1
    logprob_top = _logprob_top(body)
    if not stream:
        try:
            await asyncio.gather(*(srv.run_to_end(r) for r in reqs))
        except EngineDead:
            return await srv.die_forever()
        except (asyncio.CancelledError, ConnectionError):
            srv.abort_all(reqs)
            raise
        outs = [_answer(srv, r, final=True, logprob_top=logprob_top) for r in reqs]
        return web.json_response(outs if is_batch else outs[0])
    return await _stream(srv, request, reqs, is_batch, logprob_top)


def _logprob_top(body: Mapping[str, Any]) -> int | None:
    """None without ``return_logprob``; else how many top logprobs each token gets."""
    if not body.get("return_logprob"):
        return None
    top = body.get("top_logprobs_num")
    return top if isinstance(top, int) and _is_i64(top) and top > 0 else 0


def _submit_all(
    srv: TwinServer,
    body: Mapping[str, Any],
    keys: list[str],
    counts: list[int],
    sps: list[dict[str, Any]],
) -> list[GenRequest]:
    """Every prompt of the body (each ``n`` times), checked first and then queued.

    Raises:
        Refused: the tokenizer manager's refusal of one of them (nothing is queued).
    """
    if not keys:
        raise Refused("Either text, input_ids or input_embeds should be provided.")
    if len(sps) != len(keys):  # SGLang indexes one per prompt (and fails past the end)
        raise Refused("The length of sampling_params should be equal to the batch size.")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str | list):
        raise Refused("The rid should be a string or a list of strings.")
    if isinstance(rid, list) and len(rid) != len(keys):
        raise Refused(
            "The specified rids length mismatch with the batch_size for batch processing."
        )
    rids = rid if isinstance(rid, list) else [rid] * len(keys)
    planned: list[tuple[str, int, int, Stops, Any]] = []
    for key, count, one, r in zip(keys, counts, sps, rids, strict=False):
        value = one.get("max_new_tokens", 128)
        problem = srv.context_error(count, value)
        if problem is not None:
            raise Refused(problem)
        check_sampling(one)
        try:
            stops = Stops.from_params(one)
        except (TypeError, ValueError) as exc:
            raise Refused(str(exc)) from None
        budget = srv.unlimited_budget(count) if value is None else int(value)
        n = int(one.get("n") or 1)
        if not 1 <= n <= MAX_BATCH or len(planned) + n > MAX_BATCH:
            raise Refused(f"n must be in [1, {MAX_BATCH}] over the batch, got {n}.")
        planned += [(key, count, budget, stops, r if len(keys) == 1 and n == 1 else None)] * n
    category = body.get("rayspec_category")
    category = category if isinstance(category, str) and category else None
    return [
        srv.submit(key, count, budget, rid=str(r) if r else None, stops=stops, category=category)
        for key, count, budget, stops, r in planned
    ]


def _answer(
    srv: TwinServer,
    req: GenRequest,
    final: bool,
    since: int = 0,
    first: bool = False,
    stream: bool = False,
    logprob_top: int | None = None,
) -> dict[str, Any]:
    """One ``/generate`` answer or chunk (cumulative, or from ``since`` with
    ``--incremental-streaming-output``)."""
    ids = req.output_so_far
    meta = srv.meta_info(req, final, first=first, stream=stream)
    incremental = bool(srv.args.get("incremental_streaming_output"))
    if logprob_top is not None:
        meta.update(generate_fields(ids[since:] if incremental else ids, logprob_top))
    if incremental:  # every twin token has text but the special ones (pad, the last EOS)
        text = delta_text(ids, since, after_text=since > 0 and not srv.pad_text)
        return {"text": text, "output_ids": ids[since:], "meta_info": meta}
    return {"text": srv.text_of(req, final), "output_ids": ids, "meta_info": meta}


async def _stream(
    srv: TwinServer,
    request: web.Request,
    reqs: list[GenRequest],
    is_batch: bool,
    logprob_top: int | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    interval = max(1, int(srv.args.get("stream_interval") or 1))
    emitted = [0] * len(reqs)
    sent = [0] * len(reqs)
    try:
        async for i, req in srv.merged_updates(reqs):
            emitted[i] += 1
            if not req.finished and emitted[i] % interval:
                continue
            obj = _answer(srv, req, final=req.finished, since=sent[i], first=not sent[i],
                          stream=True, logprob_top=logprob_top)  # fmt: skip
            sent[i] = req.output_tokens
            if is_batch:
                obj["index"] = i
            await resp.write(sse(obj))
        await resp.write(b"data: [DONE]\n\n")
    except EngineDead:
        return await srv.die_forever()
    except ConnectionError:  # the client went away: drop its requests quietly
        srv.abort_all(reqs)
    except asyncio.CancelledError:
        srv.abort_all(reqs)
        raise
    return resp
