"""SGLang 0.5.23's error answers, in the shapes its HTTP server gives them (``docs/sglang.md``,
*Error answers*; recorded from the real server by ``tests/real_sglang/test_contract_diff.py``).

SGLang refuses a request at four layers, each with its own body:

- FastAPI's router: an unknown path or method is ``{"detail": "Not Found"}`` (404) or
  ``{"detail": "Method Not Allowed"}`` (405), JSON.
- The request model (pydantic): a body that is not JSON, not an object, or a field of the wrong
  type is OpenAI's ``ErrorResponse`` with ``type: "Bad Request"`` and a message listing each
  validation error (:func:`validation_error`), on every endpoint.
- ``/generate``'s JSON contract (``api_contract.py``, a generated decoder): a sampling
  parameter of the wrong type, or an unknown one, is ``{"error": "<text>"}``
  (:func:`contract_error`).
- The tokenizer manager's checks (a budget past the context length, a negative
  ``max_new_tokens``, ...) raise ``ValueError``: ``/generate`` answers ``{"error": {"message":
  ...}}`` (:func:`generate_error`; streamed, an HTTP 200 stream of one ``{"error": {...}}``
  chunk and ``[DONE]``, :func:`generate_stream_error`), the OpenAI endpoints their
  ``ErrorResponse`` with ``type: "BadRequestError"`` (:func:`openai_error`), also when asked
  to stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def sse(obj: Any) -> bytes:
    """One server-sent event of ``obj``."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def not_found() -> web.Response:
    return web.json_response({"detail": "Not Found"}, status=404)


def method_not_allowed() -> web.Response:
    return web.json_response({"detail": "Method Not Allowed"}, status=405)


def generate_error(message: str, status: int = 400) -> web.Response:
    """``/generate``'s answer to a ``ValueError`` (``_create_error_response``)."""
    return web.json_response({"error": {"message": message}}, status=status)


def generate_stream_error(message: str, status: int = 400) -> bytes:
    """The one chunk of a ``/generate`` stream refused with a ``ValueError``."""
    error = {"message": message, "type": "invalid_request_error", "code": status,
             "retryable": False}  # fmt: skip
    return sse({"error": error})


def contract_error(message: str) -> web.Response:
    """``/generate``'s JSON contract refusing a body (a string, not an object)."""
    return web.json_response({"error": message}, status=400)


def openai_error(
    message: str, status: int = 400, err_type: str = "BadRequestError"
) -> web.Response:
    """OpenAI's ``ErrorResponse``, as SGLang's ``create_error_response`` sends it."""
    body = {"object": "error", "message": message, "type": err_type, "param": None,
            "code": status}  # fmt: skip
    return web.json_response(body, status=status)


def issue(kind: str, loc: Sequence[str | int], msg: str, value: Any = None) -> str:
    """One pydantic validation error, as SGLang's message lists them."""
    where = ("body", *loc)
    return f"{{'type': {kind!r}, 'loc': {where!r}, 'msg': {msg!r}, 'input': {value!r}}}"


def validation_error(issues: Sequence[str]) -> web.Response:
    """The request model refused the body: SGLang's ``RequestValidationError`` answer."""
    count = len(issues)
    head = f"{count} validation error{'s' if count != 1 else ''}:"
    message = "\n  ".join([head, *issues])
    return openai_error(message, err_type="Bad Request")


def invalid_json(exc: ValueError) -> web.Response:
    return validation_error([issue("json_invalid", (0,), "JSON decode error", {})])


def not_an_object(value: Any, model: str) -> web.Response:
    """The body parsed, but is not an object (``model``: the request class)."""
    text = (
        f"Input should be a dictionary or an instance of {model}"
        if model == "GenerateReqInput"
        else "Input should be a valid dictionary or object to extract fields from"
    )
    kind = "dataclass_type" if model == "GenerateReqInput" else "model_attributes_type"
    return validation_error([issue(kind, (), text, _short(value))])


def _short(value: Any) -> Any:
    """A value as a message quotes it (long ones cut: the message stays small)."""
    text = repr(value)
    return value if len(text) <= 200 else text[:200] + "..."


def type_issue(loc: Sequence[str | int], expected: str, value: Any) -> str:
    """A field of the wrong type (``expected``: ``str``, ``list``, ``int``, ``dict``, ...)."""
    kinds = {
        "str": ("string_type", "Input should be a valid string"),
        "list": ("list_type", "Input should be a valid list"),
        "int": ("int_type", "Input should be a valid integer"),
        "float": ("float_parsing", "Input should be a valid number"),
        "bool": ("bool_type", "Input should be a valid boolean"),
        "dict": ("dict_type", "Input should be a valid dictionary"),
    }
    kind, msg = kinds[expected]
    return issue(kind, loc, msg, _short(value))


def missing_issue(loc: Sequence[str | int], body: Any) -> str:
    return issue("missing", loc, "Field required", _short(body))


def weight_versions(tokens: int) -> list[dict[str, Any]]:
    """SGLang's weight-version spans of an output (one version, never updated here)."""
    return [{"version": "default", "start": 0, "end": tokens}]
