"""The OpenAI dialect: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, translated.

Requests are read into a `TurnRequest` (`chat_to_turn`, `completion_to_turn`), answers written
from a `TurnResult` in OpenAI's shapes, whole (`chat_from_turn`, `completion_from_turn`) or as
server-sent events (`chat_stream`, `completion_stream`: the finished result in a few chunks,
then `data: [DONE]`). Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`.

Read: `messages` (roles system, developer (as system), user, assistant with `tool_calls`, tool;
content a string or text parts), `tools` (function tools), `tool_choice`, `n`, `max_tokens` /
`max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`, `presence_penalty`,
`frequency_penalty`, `stream`, `stream_options.include_usage`. Defaults are vLLM's: a chat
without `max_tokens` / `max_completion_tokens` (absent or null) may write the rest of the
context, within the session's token budget (`session.Session`); a text completion without
`max_tokens` gets 16 (null: the rest of the context); unset sampling fields are left to the
server (temperature 1, top_p 1, n 1). Checked, then ignored (answers carry no logprobs):
`logprobs` (chat: a boolean; completions: an integer 0 to `MAX_LOGPROBS`) and `top_logprobs`
(0 to `MAX_LOGPROBS`). Ignored: everything else (`user`, `metadata`, ...). Refused (400,
`param` naming the field): image or audio parts,
non-function tools, `n` over `MAX_N`, a field of the wrong type or out of its range (`max_tokens`
up to `fields.MAX_TOKENS`, `temperature` 0 to 2, `top_p` 0 to 1, penalties -2 to 2, `seed` an
int64, `stop` a string or strings, `stream` a boolean, `stream_options` an object).
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

from atropos.proxy import fields
from atropos.proxy.turns import ProxyError, TurnRequest, TurnResult

__all__ = [
    "COMPLETION_MAX_TOKENS",
    "MAX_N",
    "chat_from_turn",
    "chat_stream",
    "chat_to_turn",
    "completion_from_turn",
    "completion_stream",
    "completion_to_turn",
    "error_body",
    "models_body",
    "read_messages",
    "stream_flags",
]

MAX_N = 64
COMPLETION_MAX_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's and vLLM's default
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_ROLES = {"system", "developer", "user", "assistant", "tool"}
_PLAIN_ROLES = frozenset({"system", "user", "assistant"})  # `{role, content: str}` is valid as is
_ID_PREFIX = secrets.token_hex(8)  # an answer's id: this process's random prefix and a counter
_ID_COUNT = itertools.count()


def _new_id() -> str:
    """32 hex digits, unique per answer (as `uuid4().hex`, without a random read per call)."""
    return f"{_ID_PREFIX}{next(_ID_COUNT):016x}"


def error_body(err: ProxyError) -> dict[str, Any]:
    """OpenAI's error JSON."""
    return {
        "error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}
    }


def models_body(model: str) -> dict[str, Any]:
    """`GET /v1/models`: the one model the proxy serves."""
    entry = {"id": model, "object": "model", "created": 0, "owned_by": "atropos"}
    return {"object": "list", "data": [entry]}


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ProxyError(400, f"{where}.content must be a string or a list of text parts")
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("text", "input_text", "output_text") or not isinstance(
            part.get("text"), str
        ):
            raise ProxyError(
                400,
                f"{where}.content[{i}] is a {kind or type(part).__name__!s} part: the proxy"
                " takes text parts only (the policy is a text model)",
            )
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ProxyError(400, f"{where}.tool_calls must be a list")
    calls = []
    for i, call in enumerate(value):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ProxyError(400, f"{where}.tool_calls[{i}] needs function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(
            {
                "id": str(call.get("id") or f"call_{i}"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return calls


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ProxyError(400, "messages must be a non-empty list of chat messages")
    return read_messages(value)


def read_messages(value: list[Any], start: int = 0) -> list[dict[str, Any]]:
    """Messages `start`, `start + 1`, ... of a call, read (errors name them by that index)."""
    out = []
    for i, m in enumerate(value, start):
        if type(m) is dict and len(m) == 2 and m.get("role") in _PLAIN_ROLES:
            if type(m.get("content")) is str:  # what the checks below would build: kept as is
                out.append(m)
                continue
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise ProxyError(400, f"{where} needs a role: one of {', '.join(sorted(_ROLES))}")
        role = "system" if m["role"] == "developer" else m["role"]
        message: dict[str, Any] = {"role": role, "content": _content(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = _tool_calls(m["tool_calls"], where)
        if role == "tool":
            message["tool_call_id"] = fields.string(m, "tool_call_id", where) or ""
            message["content"] = message["content"] or ""
        elif message["content"] is None and "tool_calls" not in message:
            message["content"] = ""
        name = fields.string(m, "name", where)
        if name:
            message["name"] = name
        out.append(message)
    return out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ProxyError(400, "tools must be a list of function tools")
    tools = []
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise ProxyError(400, f"tools[{i}] is a {kind!s} tool: only function tools are served")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ProxyError(400, f"tools[{i}] needs function.name")
        where = f"tools[{i}].function"
        entry = {"name": fn["name"], "description": fields.string(fn, "description", where) or ""}
        parameters = fields.mapping(fn, "parameters", where)
        entry["parameters"] = parameters or {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": entry})
    return tools


def _common(body: Mapping[str, Any], default_max: int | None = None) -> dict[str, Any]:
    """`n`, the token limit and the sampling fields. The limit is `max_completion_tokens`, else
    `max_tokens`; absent, `default_max`; null, None (the rest of the context: `Session`)."""
    n = fields.integer(body, "n", 1, MAX_N) or 1
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    limit = fields.integer(body, name, 1, fields.MAX_TOKENS)
    if limit is None and name not in body:
        limit = default_max
    sampling: dict[str, Any] = {}
    for key, (low, high) in _RANGES.items():
        value = fields.number(body, key, low, high)
        if value is not None:
            sampling[key] = value
    seed = fields.integer(body, "seed", -fields.MAX_SEED - 1, fields.MAX_SEED)
    if seed is not None:
        sampling["seed"] = seed
    stop = _stop(body.get("stop"))
    if stop is not None:
        sampling["stop"] = stop
    return {"n": n, "max_tokens": limit, "sampling": sampling}


def _stop(value: Any) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ProxyError(
            400,
            f"stop: expected a string or a list of strings, got {fields.shown(value)}",
            param="stop",
        )
    return value


def _tool_choice(value: Any) -> Any:
    """`tool_choice`: "auto", "none", "required" or {type: "function", function: {name}}."""
    if value is None or value in ("auto", "none", "required"):
        return value
    fn = value.get("function") if isinstance(value, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ProxyError(
            400,
            "tool_choice: expected 'auto', 'none', 'required' or {type: 'function', function:"
            f" {{name}}}}, got {fields.shown(value)}",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": fn["name"]}}


def stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether to stream, and whether the stream ends with a usage chunk
    (`stream_options.include_usage`)."""
    stream = bool(fields.boolean(body, "stream"))
    options = fields.mapping(body, "stream_options") or {}
    return stream, bool(fields.boolean(options, "include_usage", "stream_options"))


def chat_to_turn(
    body: Mapping[str, Any], messages: list[dict[str, Any]] | None = None
) -> TurnRequest:
    """A `/v1/chat/completions` body as a `TurnRequest` (ProxyError 400 when malformed);
    `messages`: the body's messages already read (`proxy.resend`), else read here."""
    fields.boolean(body, "logprobs")
    fields.integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    return TurnRequest(
        messages=_messages(body.get("messages")) if messages is None else messages,
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        **_common(body),
    )


def completion_to_turn(body: Mapping[str, Any]) -> TurnRequest:
    """A `/v1/completions` body as a `TurnRequest` with a raw `prompt`; `max_tokens` absent is
    `COMPLETION_MAX_TOKENS` (16), null the rest of the context, as in vLLM."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ProxyError(400, "prompt must be a non-empty string (one prompt per request)")
    fields.integer(body, "logprobs", 0, MAX_LOGPROBS)
    return TurnRequest(messages=[], prompt=prompt, **_common(body, COMPLETION_MAX_TOKENS))


def _usage(result: TurnResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def chat_from_turn(result: TurnResult) -> dict[str, Any]:
    """The `chat.completion` answer."""
    return {
        "id": f"chatcmpl-{_new_id()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.model,
        "choices": [
            {"index": i, "message": c.message(), "finish_reason": c.finish_reason, "logprobs": None}
            for i, c in enumerate(result.choices)
        ],
        "usage": _usage(result),
    }


def _sse(doc: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def _pieces(text: str, size: int = 64) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chat_stream(result: TurnResult, include_usage: bool = False) -> Iterator[bytes]:
    """The `chat.completion.chunk` events of a finished result, then `[DONE]`."""
    head = {
        "id": f"chatcmpl-{_new_id()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": result.model,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse({**head, "choices": [choice]})

    for i, choice in enumerate(result.choices):
        yield chunk(i, {"role": "assistant", "content": ""})
        for piece in _pieces(choice.content):
            yield chunk(i, {"content": piece})
        for k, call in enumerate(choice.tool_calls):
            fn = call["function"]
            opening = {"index": k, "id": call["id"], "type": "function"}
            opening["function"] = {"name": fn["name"], "arguments": ""}
            yield chunk(i, {"tool_calls": [opening]})
            for piece in _pieces(fn["arguments"]):
                yield chunk(i, {"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
        yield chunk(i, {}, choice.finish_reason)
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(result)})
    yield b"data: [DONE]\n\n"


def completion_from_turn(result: TurnResult) -> dict[str, Any]:
    """The `text_completion` answer (the raw text up to its stop string: no tool calls are read
    from it)."""
    return {
        "id": f"cmpl-{_new_id()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": result.model,
        "choices": [
            {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
            for i, c in enumerate(result.choices)
        ],
        "usage": _usage(result),
    }


def completion_stream(result: TurnResult) -> Iterator[bytes]:
    """The `text_completion` chunks of a finished result, then `[DONE]`."""
    whole = completion_from_turn(result)
    head = {k: whole[k] for k in ("id", "object", "created", "model")}
    for i, choice in enumerate(result.choices):
        for piece in _pieces(choice.text):
            part = {"index": i, "text": piece, "finish_reason": None, "logprobs": None}
            yield _sse({**head, "choices": [part]})
        end = {"index": i, "text": "", "finish_reason": choice.finish_reason, "logprobs": None}
        yield _sse({**head, "choices": [end]})
    yield b"data: [DONE]\n\n"
