"""Error bodies, one shape per dialect, and what an exception escaping a handler means.

Each server speaks one or more dialects, and every error it gives, whatever part of it refuses
the request (the rules in front of every route, a handler, the last line of defence), has that
dialect's shape:

- `api_error`: the trajectory API's `{"error": {"type", "message"}, "detail"}` (`detail` is
  what atroposlib's FastAPI clients read).
- `openai_error`: OpenAI's and vLLM's `{"error": {"message", "type", "param", "code"}}`
  (`atropos local serve`, the proxy's OpenAI routes, the shipped fake server).
- `jsonrpc_error`: JSON-RPC 2.0's `{"jsonrpc", "id": null, "error": {"code", "message"}}`
  (the MCP fixture server).

The proxy's Anthropic dialect lives with the proxy (`atropos.proxy.anthropic_api`), which
adapts it to `ErrorShape`.

>>> openai_error(400, "max_tokens: expected an integer", "BadRequestError", "max_tokens")
{'error': {'message': 'max_tokens: expected an integer', 'type': 'BadRequestError', \
'param': 'max_tokens', 'code': 400}}
>>> classify(RecursionError())
(400, 'the request is nested too deeply: flatten it', 'BadRequest')
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import msgspec

from atropos.wire import ProtocolError

__all__ = [
    "ErrorShape",
    "api_error",
    "classify",
    "jsonrpc_error",
    "openai_error",
]


class ErrorShape(Protocol):
    """A dialect's error body for a status, a message, a kind (the error's type name where
    the dialect has one) and the offending field (None when no one field is at fault)."""

    def __call__(
        self, status: int, message: str, kind: str, param: str | None = None
    ) -> dict[str, Any]: ...


def api_error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """The trajectory API's error body."""
    return {"error": {"type": kind, "message": message}, "detail": message}


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's (and vLLM's) error body; `code` is the HTTP status, as vLLM gives it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


JSONRPC_CODES = {400: -32700, 413: -32600, 415: -32600, 500: -32603}
"""JSON-RPC error codes for HTTP statuses (parse error, invalid request, internal error);
others are -32000, the first of the codes left to servers."""


def jsonrpc_error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """JSON-RPC 2.0's error response, for a request whose id is unknown."""
    code = JSONRPC_CODES.get(status, -32000)
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


def classify(err: BaseException) -> tuple[int, str, str]:
    """The status, message and kind an exception escaping a handler is answered with: a 4xx
    for what only input can cause (too deep, not UTF-8, not JSON, a number out of range, a
    `ProtocolError` with its own status), else 500 (a bug: the caller logs it)."""
    if isinstance(err, ProtocolError):
        return err.status, str(err), type(err).__name__
    if isinstance(err, RecursionError):
        return 400, "the request is nested too deeply: flatten it", "BadRequest"
    if isinstance(err, UnicodeError):
        return 400, "the request is not valid UTF-8: send UTF-8 text", "BadRequest"
    if isinstance(err, OverflowError):
        return 400, "a number in the request is out of range", "BadRequest"
    if isinstance(err, (msgspec.DecodeError, json.JSONDecodeError)):
        return 400, f"the body is not valid JSON: {str(err)[:200]}", "BadRequest"
    return (
        500,
        f"internal error ({type(err).__name__}): the server's log has the details",
        ("InternalError"),
    )
