"""SGLang's OpenAI endpoints for the twin: ``/v1/completions`` and ``/v1/chat/completions``, as
answers and as streams, in SGLang 0.5.23's shapes.

Streams: the chat role goes out with a choice's first token (``content: ""``), then a chunk per
update whose text is not empty (a token without text, such as a special token, sends no chat
chunk: its count shows in the next chunk's ``usage`` and the final usage chunk), and the
finish of every choice in a chunk of its own once all are done; a completion sends a chunk for
every update (its text may be empty) with the finish on the last. After them: the
response-level ``sglext.spec_tokens_details`` in a chunk with ``choices: []``, then the usage
chunk when asked for. ``n`` choices are ``n`` requests of the same prompt, each chunk with its
request's id (SGLang's ids carry no ``chatcmpl-``/``cmpl-`` prefix). ``logprobs`` are the
twin's (:mod:`rayspec.twin._logprobs`). A request SGLang refuses is refused in its shape, also
when asked to stream (SGLang checks before the stream starts): its request model's validation
errors, then its ``ValueError`` checks (the context length, a negative chat budget).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from aiohttp import web

from rayspec.twin._ends import Stops
from rayspec.twin._engine import EngineDead
from rayspec.twin._engine import GenRequest
from rayspec.twin._logprobs import chat_logprobs
from rayspec.twin._logprobs import completion_logprobs
from rayspec.twin._replies import SSE_HEADERS
from rayspec.twin._replies import issue
from rayspec.twin._replies import missing_issue
from rayspec.twin._replies import openai_error
from rayspec.twin._replies import sse
from rayspec.twin._replies import type_issue
from rayspec.twin._replies import validation_error
from rayspec.twin._replies import weight_versions
from rayspec.twin._text import count_prompt_tokens
from rayspec.twin._text import delta_text

if TYPE_CHECKING:
    from rayspec.twin._app import TwinServer

# Roles SGLang's chat request takes: "user" exactly, the others in any case.
_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
MAX_CHOICES = 128  # the twin's bound on n (each choice is a request)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _role_issues(index: int, message: Any) -> list[str]:
    """The request model's errors for one chat message (none when it is valid)."""
    loc: tuple[str | int, ...] = ("messages", index)
    generic = "function-after[validate_thinking_parts_role(), ChatCompletionMessageGenericParam]"
    user = "function-after[validate_thinking_parts_role(), ChatCompletionMessageUserParam]"
    if not isinstance(message, dict):
        return [type_issue((*loc, generic), "dict", message),
                type_issue((*loc, user), "dict", message)]  # fmt: skip
    role = message.get("role")
    if role is None:
        return [missing_issue((*loc, generic, "role"), message),
                missing_issue((*loc, user, "role"), message)]  # fmt: skip
    if role == "user" or (isinstance(role, str) and role.lower() in _ROLES):
        return []
    allowed = ", ".join(repr(r) for r in _ROLES)
    return [
        issue("value_error", (*loc, generic, "role"),
              f"Value error, 'role' must be one of {allowed} (case-insensitive).", role),
        issue("literal_error", (*loc, user, "role"), "Input should be 'user'", role),
    ]  # fmt: skip


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


@dataclasses.dataclass(frozen=True)
class _Ask:
    """One OpenAI request, checked."""

    chat: bool
    prompt_key: str
    prompt_tokens: int
    budget: int | None  # None: no limit (chat without a max-token field)
    stops: Stops
    n: int
    logprobs: int | None  # None: not asked; else the top count


def _int_issue(key: str, value: Any) -> str | None:
    if value is None or _is_int(value):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return None
    if isinstance(value, float) and value.is_integer():
        return issue("int_parsing_size", (key,), "Unable to parse input string as an integer, "
                     "exceeded maximum size", value)  # fmt: skip
    return type_issue((key,), "int", value)


def _common_issues(body: Mapping[str, Any]) -> list[str]:
    """The request model's errors of the fields both endpoints share."""
    issues = []
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        issues.append(type_issue(("temperature",), "float", temperature))
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        issues += [type_issue(("stop", "list[str]"), "list", stop),
                   type_issue(("stop", "str"), "str", stop)]  # fmt: skip
    ids = body.get("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(_is_int(i) for i in ids)):
        issues.append(type_issue(("stop_token_ids",), "list", ids))
    for key in ("stream", "ignore_eos", "no_stop_trim"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            issues.append(type_issue((key,), "bool", body[key]))
    for key in ("n", "min_tokens"):
        found = _int_issue(key, body.get(key))
        if found:
            issues.append(found)
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        issues.append(type_issue(("stream_options",), "dict", body["stream_options"]))
    return issues


def _check(srv: TwinServer, body: dict[str, Any], chat: bool) -> _Ask | web.Response:
    """The request, or SGLang's refusal of it."""
    issues = _common_issues(body)
    logprobs: int | None = None
    if chat:
        messages = body.get("messages")
        if messages is None:
            issues.append(missing_issue(("messages",), body))
        elif not isinstance(messages, list):
            issues.append(type_issue(("messages",), "list", messages))
        else:
            for i, m in enumerate(messages):
                issues += _role_issues(i, m)
        keys: tuple[str, ...] = ("max_tokens", "max_completion_tokens", "top_logprobs")
        if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
            issues.append(type_issue(("logprobs",), "bool", body["logprobs"]))
    else:
        prompt = body.get("prompt")
        if "prompt" not in body:
            issues.append(missing_issue(("prompt",), body))
        elif not _prompt_ok(prompt):
            issues += [type_issue(("prompt", "list[int]"), "list", prompt),
                       type_issue(("prompt", "list[list[int]]"), "list", prompt),
                       type_issue(("prompt", "str"), "str", prompt),
                       type_issue(("prompt", "list[str]"), "list", prompt)]  # fmt: skip
        keys = ("max_tokens", "logprobs")
    for key in keys:
        found = _int_issue(key, body.get(key))
        if found:
            issues.append(found)
    if not chat and _is_int(body.get("max_tokens")) and body["max_tokens"] <= 0:
        issues.append(
            issue(
                "value_error",
                ("max_tokens",),
                "Value error, max_tokens must be positive",
                body["max_tokens"],
            )
        )
    if issues:
        return validation_error(issues)
    n = int(body.get("n") or 1) if body.get("n") is not None else 1
    if n < 1:
        return openai_error("range() arg 3 must not be zero", err_type="BadRequest")
    if n > MAX_CHOICES:
        return openai_error(f"n must be at most {MAX_CHOICES} (the twin's bound), got {n}")
    if chat:
        if not body["messages"]:
            return openai_error("Messages cannot be empty.")
        parsed = chat_prompt(body["messages"])
        if isinstance(parsed, str):
            return openai_error(parsed)
        key, text = parsed
        tokens = count_prompt_tokens(text)
        # No max-token field: no limit (SGLang passes max_new_tokens None), not 128.
        raw = body.get("max_completion_tokens")
        raw = body.get("max_tokens") if raw is None else raw
        if raw is not None and int(raw) < 0:
            return openai_error(f"max_new_tokens must be at least 0, got {int(raw)}.")
        if body.get("logprobs"):
            logprobs = int(body.get("top_logprobs") or 0)
    else:
        key, tokens = _completion_prompt(body["prompt"])
        raw = body.get("max_tokens")
        raw = 16 if raw is None else raw
        if body.get("logprobs") is not None:
            logprobs = int(body["logprobs"])
    budget = None if raw is None else int(raw)
    problem = srv.context_error(tokens, budget)
    if problem is not None:
        return openai_error(problem)
    try:
        stops = Stops.from_params(body)
    except (TypeError, ValueError) as exc:
        return openai_error(str(exc))
    return _Ask(chat, key, tokens, budget, stops, n, logprobs)


def _prompt_ok(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list):
        return False
    return (
        all(isinstance(p, str) for p in prompt)
        or all(_is_int(p) for p in prompt)
        or all(isinstance(p, list) and all(_is_int(i) for i in p) for p in prompt)
    )


def _completion_prompt(prompt: Any) -> tuple[str, int]:
    """The key and token count of a completion's (first) prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_prompt_tokens(prompt)
    ids = prompt[0] if prompt and isinstance(prompt[0], list) else prompt
    return json.dumps(ids), max(1, len(ids))


async def completions(srv: TwinServer, request: web.Request) -> web.StreamResponse:
    return await _serve(srv, request, chat=False)


async def chat_completions(srv: TwinServer, request: web.Request) -> web.StreamResponse:
    return await _serve(srv, request, chat=True)


async def _serve(srv: TwinServer, request: web.Request, *, chat: bool) -> web.StreamResponse:
    model_name = "ChatCompletionRequest" if chat else "CompletionRequest"
    body, refused = await srv.json_body(request, model_name)
    if refused is not None:
        return refused
    ask = _check(srv, body, chat)
    if isinstance(ask, web.Response):
        return ask
    category = body.get("rayspec_category")
    category = category if isinstance(category, str) and category else None
    reqs = [
        srv.submit(
            ask.prompt_key,
            ask.prompt_tokens,
            srv.unlimited_budget(ask.prompt_tokens) if ask.budget is None else ask.budget,
            stops=ask.stops,
            category=category,
        )
        for _ in range(ask.n)
    ]
    view = _View(srv, ask, reqs, model=str(body.get("model") or srv.model_name),
                 spec_details=bool(body.get("return_spec_tokens_details")))  # fmt: skip
    if not body.get("stream"):
        try:
            await asyncio.gather(*(srv.run_to_end(r) for r in reqs))
        except EngineDead:
            return await srv.die_forever()
        except (asyncio.CancelledError, ConnectionError):
            srv.abort_all(reqs)
            raise
        return web.json_response(view.response())
    options = body.get("stream_options") or {}
    include_usage = bool(options.get("include_usage")) or bool(
        srv.args.get("stream_response_default_include_usage")
    )
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    try:
        async for chunk in view.stream(bool(options.get("continuous_usage_stats"))):
            await resp.write(sse(chunk))
        for chunk in view.trailer(include_usage):
            await resp.write(sse(chunk))
        await resp.write(b"data: [DONE]\n\n")
    except EngineDead:
        return await srv.die_forever()
    except ConnectionError:  # the client went away: drop its requests quietly
        srv.abort_all(reqs)
    except asyncio.CancelledError:
        srv.abort_all(reqs)
        raise
    return resp


class _View:
    """The OpenAI answers of one request's ``n`` choices (one engine request each)."""

    def __init__(
        self, srv: TwinServer, ask: _Ask, reqs: list[GenRequest], model: str, spec_details: bool
    ) -> None:
        self.srv = srv
        self.ask = ask
        self.reqs = reqs
        self.model = model
        self.spec_details = spec_details
        self.created = int(time.time())
        self.kind = "chat.completion" if ask.chat else "text_completion"
        self._last = reqs[0]  # the choice of the latest chunk (the trailer's id)

    def _head(self, req: GenRequest) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.ask.chat else "text_completion"
        return {"id": req.rid, "object": kind, "created": self.created, "model": self.model}

    def usage(self, reqs: list[GenRequest] | None = None) -> dict[str, Any]:
        """SGLang's ``UsageInfo``, every field (``prompt_tokens_details`` is set with
        ``--enable-cache-report``; ``completion_tokens_details`` only when there are reasoning
        tokens, never here). The prompt is counted once for all choices."""
        reqs = self.reqs if reqs is None else reqs
        completion = sum(r.output_tokens for r in reqs)
        usage: dict[str, Any] = {
            "prompt_tokens": self.ask.prompt_tokens,
            "total_tokens": self.ask.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        if self.srv.args.get("enable_cache_report"):
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def sglext(self) -> dict[str, Any] | None:
        """The response-level ``sglext`` of ``return_spec_tokens_details``: SGLang's
        ``SpecTokensDetails`` (every field, the DSpark ones zero; a list for several
        choices); None without speculation or when not asked."""
        if not self.spec_details:
            return None
        spec, version = self.srv.engine.spec, self.srv.version
        found = []
        for req in self.reqs:
            meta = req.meta_spec(spec, version)
            if not meta:
                return None
            found.append({
                "spec_accept_rate": float(meta.get("spec_accept_rate") or 0.0),
                "spec_accept_length": float(meta.get("spec_accept_length") or 0.0),
                "spec_cap_length": 0.0,
                "spec_block_accept_length": 0.0,
                "spec_num_correct_drafts": int(meta.get("spec_num_correct_drafts") or 0),
                "spec_num_proposed_drafts": int(meta.get("spec_num_proposed_drafts") or 0),
                "spec_verify_ct": int(meta.get("spec_verify_ct") or 0),
                "spec_correct_drafts_histogram": list(
                    meta.get("spec_correct_drafts_histogram") or []),
                "spec_cap_lens_histogram": [],
            })  # fmt: skip
        return {"spec_tokens_details": found if len(found) > 1 else found[0]}

    def _logprobs(self, ids: list[int], start: int) -> dict[str, Any] | None:
        top = self.ask.logprobs
        if top is None:
            return None
        if self.ask.chat:
            return chat_logprobs(ids, start, top)
        return completion_logprobs(ids, start, top)

    def response(self) -> dict[str, Any]:
        """A non-streaming answer, as SGLang 0.5.23 sends it (unset optional fields such as
        hidden_states and tool_calls left out; the weight versions in ``metadata``)."""
        choices = []
        for index, req in enumerate(self.reqs):
            text = self.srv.text_of(req, final=True)
            finish = self.srv.finish_reason(req)
            choice: dict[str, Any] = {"index": index}
            if self.ask.chat:
                choice["message"] = {"role": "assistant", "content": text,
                                     "reasoning_content": None}  # fmt: skip
            else:
                choice["text"] = text
            choice.update(
                {
                    "logprobs": self._logprobs(req.output_so_far, 0),
                    "finish_reason": finish["type"],
                    "matched_stop": finish.get("matched"),
                }
            )
            choices.append(choice)
        first = self.reqs[0]
        out: dict[str, Any] = {
            "id": first.rid,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
            "metadata": {
                "weight_version": "default",
                "weight_versions": weight_versions(first.output_tokens),
            },
        }
        sglext = self.sglext()
        if sglext is not None:
            out["sglext"] = sglext
        return out

    async def stream(self, continuous: bool) -> AsyncIterator[dict[str, Any]]:
        """The chunks of every choice until all finish (the trailer follows)."""
        chat = self.ask.chat
        seen = [0] * len(self.reqs)  # tokens sent per choice
        chars = [0] * len(self.reqs)  # characters of text sent per choice
        finished: list[tuple[int, dict[str, Any]]] = []
        last = self.reqs[0]
        async for i, req in self.srv.merged_updates(self.reqs):
            if req.output_tokens == seen[i] and not req.finished:
                continue
            last = req
            if chat and seen[i] == 0 and req.output_tokens:  # the role, with the first token
                yield self._chat_chunk(req, i, {"role": "assistant", "content": ""})
            start, seen[i] = seen[i], req.output_tokens
            new = req.output_so_far[start:]
            if req.finished:  # the final text (a matched stop string or token trimmed)
                delta = self.srv.text_of(req, final=True)[chars[i] :]
            else:
                delta = delta_text(new, 0, after_text=chars[i] > 0)
            chars[i] += len(delta)
            ending = self.srv.finish_reason(req) if req.finished else None
            usage = self.usage([req]) if continuous else None
            if chat:  # content, then (once all are done) the finish in a chunk of its own
                if delta:
                    yield self._chat_chunk(req, i, {"content": delta}, usage=usage,
                                           logprobs=self._logprobs(new, start))  # fmt: skip
                if ending is not None:
                    finished.append((i, ending))
                continue
            # Completions: every update is a chunk (its text may be empty), the finish on the
            # last; usage always there (null unless continuous).
            c = {"index": i, "text": delta, "logprobs": self._logprobs(new, start),
                 "finish_reason": ending["type"] if ending else None,
                 "matched_stop": ending.get("matched") if ending else None}  # fmt: skip
            yield {**self._head(req), "choices": [c], "usage": usage}
        for i, ending in finished:
            yield self._chat_chunk(last, i, {}, ending)
        self._last = last

    def trailer(self, include_usage: bool) -> list[dict[str, Any]]:
        """After the choices: the response-level sglext chunk, then the usage chunk."""
        head = self._head(self._last)
        out = []
        sglext = self.sglext()
        if sglext is not None:
            out.append({**head, "choices": [], "usage": None, "sglext": sglext})
        if include_usage:
            usage = self.usage()
            if not self.ask.chat:  # SGLang dumps this one with exclude_none
                usage = {k: v for k, v in usage.items() if v is not None}
            out.append({**head, "choices": [], "usage": usage})
        return out

    def _chat_chunk(
        self,
        req: GenRequest,
        index: int,
        delta: dict[str, Any],
        finish: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        # SGLang's msgspec StreamChunk: delta always has reasoning_content (null when there
        # is none), role and content only when set; usage only when asked for.
        c = {"index": index, "delta": {"reasoning_content": None, **delta}, "logprobs": logprobs,
             "finish_reason": finish["type"] if finish else None,
             "matched_stop": finish.get("matched") if finish else None}  # fmt: skip
        chunk: dict[str, Any] = {**self._head(req), "choices": [c]}
        if usage is not None:
            chunk["usage"] = usage
        return chunk
