"""Anthropic Messages (`POST /v1/messages`) in the proxy's terms: requests to `TurnRequest`,
results to a `message`, its server-sent events, and Anthropic's error shape.

Pure translation; the app (routes, auth, sessions) calls these. Content the policy cannot read
(images, documents, thinking, server tools) is refused with a 400 that says what to send instead.

How the Anthropic shapes map onto OpenAI chat messages (`atropos.proxy.turns`):

- `system` (a string or text blocks) becomes a leading system message; a `system` turn inside
  `messages` (Claude Code sends its environment and reminders as such) stays a system message
  in its place (`cache_control` on any block is ignored: the server caches prefixes itself);
- a tool with `defer_loading: true` is left out of the prompt: the model does not see it until
  the agent loads it (Claude Code's tool search), so it must not see it here either;
- a `tool_reference` block in a `tool_result` (what a tool search answers: `{type:
  "tool_reference", tool_name}`) is where Anthropic's API expands the named tool's definition
  into the context; here it is that tool's line as chat templates write each tool (its OpenAI
  function JSON, `{"type": "function", "function": {...}}`, as `tojson` spells it), in the
  result's text, so the prompt still extends the held sequence (adding the tool to the rendered
  tools would re-render the system turn: a new sequence every search). The named tool must be
  among `tools` (deferred or not); another name is a 400;
- a user message's text blocks become one user message (texts joined by a newline, as vLLM joins
  text parts), each `tool_result` block a `{"role": "tool", "tool_call_id", "content"}` message,
  in the order written; a result with `is_error` reads `Error: <content>`;
- an assistant message's text blocks become its content, its `tool_use` blocks its `tool_calls`
  (`input` as a JSON string);
- tool ids: the proxy's `call_<hex>` ids go out as `toolu_<hex>` and come back as `call_<hex>`,
  so the conversation an agent sends back names the very calls the session generated;
- `stop_sequences` is `stop`; `top_k` is passed on as `top_k`.

>>> turn = to_turn({"model": "m", "max_tokens": 8, "system": "Be brief.",
...                 "messages": [{"role": "user", "content": "Hi"}]})
>>> turn.messages, turn.max_tokens
([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], 8)
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterator
from typing import Any, TypeGuard

from atropos.proxy.fields import MAX_TOKENS, shown
from atropos.proxy.turns import ProxyError, TurnChoice, TurnRequest, TurnResult

__all__ = ["error_body", "error_event", "from_turn", "stream_events", "to_turn"]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_UNREADABLE = ("image", "document", "search_result", "thinking", "redacted_thinking")
_OUR_ID, _THEIR_ID = "call_", "toolu_"


def to_turn(body: Any) -> TurnRequest:
    """Validate a Messages request body and translate it; unknown fields are ignored.

    Raises:
        ProxyError: 400 naming the first field that is missing, ill-typed or unsupported.
    """
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object with model, max_tokens and messages")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model: required, a non-empty string naming the model")
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS:
        raise _bad(
            f"max_tokens: required, expected an integer from 1 to {MAX_TOKENS}, got"
            f" {shown(max_tokens)}"
        )
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream: must be true or false")
    output = body.get("output_config")
    if isinstance(output, dict) and output.get("format") is not None:
        raise _bad(
            "output_config.format: structured outputs are not supported by this proxy; "
            "leave it out and ask for the format in the prompt"
        )
    tools, every = _tools(body.get("tools"))
    return TurnRequest(
        messages=_system(body.get("system")) + _messages(body.get("messages"), every),
        tools=tools or None,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        max_tokens=max_tokens,
        sampling=_sampling(body),
    )


def from_turn(
    result: TurnResult, model: str, *, stop_sequence: str | None = None
) -> dict[str, Any]:
    """The non-streaming answer: a `message` built from the result's first choice.

    Args:
        result: what the session generated.
        model: the model name to answer with (the one the request asked for).
        stop_sequence: which of the request's `stop_sequences` ended the completion, where the
            inference layer says so; the stop reason is then `stop_sequence`.
    """
    choice = _first(result)
    stop_reason = STOP_REASONS.get(choice.finish_reason, "end_turn")
    if choice.tool_calls:
        stop_reason = "tool_use"
    elif stop_sequence is not None and choice.finish_reason == "stop":
        stop_reason = "stop_sequence"
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(choice),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(result.prompt_tokens, result.completion_tokens),
    }


def stream_events(
    result: TurnResult, model: str, *, stop_sequence: str | None = None, pieces: int = 4
) -> Iterator[bytes]:
    """The streaming answer, as server-sent events in Anthropic's order: `message_start` (no
    content yet), then per content block `content_block_start`, its deltas (text or the
    tool input's JSON, each in up to `pieces` parts) and `content_block_stop`, then
    `message_delta` (stop reason, output tokens) and `message_stop`."""
    message = from_turn(result, model, stop_sequence=stop_sequence)
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = _usage(result.prompt_tokens, 0)
    yield _sse("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block, pieces)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    usage = {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}
    yield _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _sse("message_stop", {"type": "message_stop"})


def error_body(err: ProxyError) -> dict[str, Any]:
    """Anthropic's error JSON, `{"type": "error", "error": {"type", "message"}}`; the type is
    the one Anthropic gives its status (529: `overloaded_error`), else the error's own kind."""
    kind = ERROR_TYPES.get(err.status)
    if kind is None:
        fallback = "api_error" if err.status >= 500 else "invalid_request_error"
        kind = err.kind if err.kind in ERROR_TYPES.values() else fallback
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_event(err: ProxyError) -> bytes:
    """An `error` server-sent event, for a failure after a stream has started."""
    return _sse("error", error_body(err))


# Requests


def _bad(message: str) -> ProxyError:
    return ProxyError(400, message)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past the floats (10**400)
        return False


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or a list of text blocks (joined by a newline)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(f"{where}: must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(blocks):
        kind = _block_type(block, f"{where}[{j}]")
        if kind != "text":
            raise _unsupported(kind, f"{where}[{j}]", "text")
        texts.append(_text(block, f"{where}[{j}]"))
    return "\n".join(texts)


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _bad(f"{where}: must be a content block, an object with a string 'type'")
    return str(block["type"])


def _text(block: dict[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: required, a string")
    return str(block["text"])


def _unsupported(kind: str, where: str, allowed: str) -> ProxyError:
    why = "the policy reads text only" if kind in _UNREADABLE else "unknown to this proxy"
    return _bad(f"{where}: '{kind}' blocks are not supported ({why}); send {allowed} blocks")


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = _text_of(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: Any, tools: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: required, a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where}: must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, (str, list)):
            raise _bad(f"{where}.content: required, a string or a list of content blocks")
        if role == "user":
            out += _user(content, f"{where}.content", tools)
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        elif role == "system":  # a mid-conversation system turn (Claude Code sends them)
            out.append({"role": "system", "content": _text_of(content, f"{where}.content")})
        else:
            raise _bad(
                f"{where}.role: must be 'user', 'assistant' or 'system' (got {role!r}); put "
                "the leading system text in the top-level 'system' field"
            )
    return out


def _user(
    content: str | list[Any], where: str, tools: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """User content as OpenAI messages: runs of text as user messages, results as tool ones
    (`tools`: every tool of the request by name, for the references a result holds)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not content:
        raise _bad(f"{where}: must not be empty; send at least one text or tool_result block")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_text(block, f"{where}[{j}]"))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, f"{where}[{j}]", tools))
        elif kind == "tool_use":
            raise _bad(f"{where}[{j}]: tool_use blocks belong in assistant messages")
        else:
            raise _unsupported(kind, f"{where}[{j}]", "text or tool_result")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(
    block: dict[str, Any], where: str, tools: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id: required, the id of the tool_use block it answers")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error: must be true or false")
    text = _result_text(block.get("content", ""), f"{where}.content", tools)
    if is_error:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": _our_id(call_id), "content": text}


def _result_text(content: Any, where: str, tools: dict[str, dict[str, Any]]) -> str:
    """A tool result's text: a string, or text and `tool_reference` blocks (joined by a
    newline), a reference written as its tool's line in the template's tools section."""
    if not isinstance(content, list):
        return _text_of(content, where)
    texts = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_text(block, f"{where}[{j}]"))
        elif kind == "tool_reference":
            name = block.get("tool_name")
            if not isinstance(name, str) or name not in tools:
                raise _bad(
                    f"{where}[{j}].tool_name: {shown(name)} is not among the request's tools;"
                    " send the tool it names in tools (with defer_loading: true until it is"
                    " found)"
                )
            texts.append(json.dumps(tools[name], ensure_ascii=False))
        else:
            raise _unsupported(kind, f"{where}[{j}]", "text or tool_reference")
    return "\n".join(texts)


def _assistant(content: str | list[Any], where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_text(block, f"{where}[{j}]"))
        elif kind == "tool_use":
            calls.append(_tool_use(block, f"{where}[{j}]"))
        elif kind == "tool_result":
            raise _bad(f"{where}[{j}]: tool_result blocks belong in user messages")
        else:
            raise _unsupported(kind, f"{where}[{j}]", "text or tool_use")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    for name in ("id", "name"):
        if not isinstance(block.get(name), str) or not block[name]:
            raise _bad(f"{where}.{name}: required, a non-empty string")
    if not isinstance(block.get("input"), dict):
        raise _bad(f"{where}.input: required, an object of the tool's arguments")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    function = {"name": block["name"], "arguments": arguments}
    return {"id": _our_id(block["id"]), "type": "function", "function": function}


def _tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The tools the prompt shows (deferred ones left out), and every tool by name."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise _bad("tools: must be a list of {name, description, input_schema} objects")
    out: list[dict[str, Any]] = []
    every: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where}: must be an object {{name, description, input_schema}}")
        if tool.get("type", "custom") != "custom":
            raise _bad(
                f"{where}: tool type {tool['type']!r} is not supported; only custom "
                "tools {name, description, input_schema} are"
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name: required, a non-empty string")
        if name in every:
            raise _bad(f"{where}.name: {name!r} is used by an earlier tool; names must be unique")
        if "description" in tool and not isinstance(tool["description"], str):
            raise _bad(f"{where}.description: must be a string")
        if not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"{where}.input_schema: required, a JSON Schema object of the arguments")
        function = {
            "name": name,
            "description": tool.get("description"),
            "parameters": tool["input_schema"],
        }
        if function["description"] is None:
            del function["description"]
        every[name] = {"type": "function", "function": function}
        if tool.get("defer_loading") is not True:  # deferred: not in the context until found
            out.append(every[name])
    return out, every


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """Anthropic's `{type: auto|any|tool|none}` as OpenAI's tool_choice."""
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    simple = {"auto": "auto", "any": "required", "none": "none"}
    if kind in simple:
        if kind == "any" and not tools:
            raise _bad("tool_choice: 'any' needs tools; send tools or leave tool_choice out")
        return simple[kind]
    if kind != "tool":
        raise _bad("tool_choice: must be {type: 'auto'|'any'|'none'} or {type: 'tool', name}")
    names = [tool["function"]["name"] for tool in tools]
    if choice.get("name") not in names:
        raise _bad(f"tool_choice.name: {choice.get('name')!r} is not one of the tools {names}")
    return {"type": "function", "function": {"name": choice["name"]}}


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for name, low, high in (("temperature", 0.0, math.inf), ("top_p", 0.0, 1.0)):
        if body.get(name) is not None:
            value = body[name]
            if not _is_number(value) or not low <= value <= high:
                raise _bad(f"{name}: must be a number from {low} to {high} (got {shown(value)})")
            sampling[name] = value
    if body.get("top_k") is not None:
        if not _is_int(body["top_k"]) or not 1 <= body["top_k"] <= MAX_TOKENS:
            raise _bad(
                f"top_k: must be an integer from 1 to {MAX_TOKENS} (got {shown(body['top_k'])})"
            )
        sampling["top_k"] = body["top_k"]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise _bad("stop_sequences: must be a list of non-empty strings")
        if stops:
            sampling["stop"] = list(stops)
    return sampling


def _our_id(call_id: str) -> str:
    """The session's id of a tool call the agent names (`toolu_X` -> `call_X`)."""
    return _OUR_ID + call_id[len(_THEIR_ID) :] if call_id.startswith(_THEIR_ID) else call_id


def _their_id(call_id: str) -> str:
    """The Anthropic-style id of one of the session's tool calls (`call_X` -> `toolu_X`)."""
    if call_id.startswith(_THEIR_ID):
        return call_id
    return _THEIR_ID + call_id.removeprefix(_OUR_ID)


# Answers


def _first(result: TurnResult) -> TurnChoice:
    if not result.choices:
        raise ValueError("a TurnResult to answer with must hold at least one choice")
    return result.choices[0]


def _content(choice: TurnChoice) -> list[dict[str, Any]]:
    """A text block (always, when there are no calls), then a tool_use block per call."""
    blocks: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        blocks.append({"type": "text", "text": choice.content})
    for call in choice.tool_calls:
        function = call["function"]
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        blocks.append(
            {
                "type": "tool_use",
                "id": _their_id(str(call.get("id") or f"{_OUR_ID}{secrets.token_hex(12)}")),
                "name": function["name"],
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _split(text: str, pieces: int) -> list[str]:
    """`text` in up to `pieces` consecutive parts (one empty part for empty text)."""
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _block_events(index: int, block: dict[str, Any], pieces: int) -> Iterator[bytes]:
    if block["type"] == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": part} for part in _split(block["text"], pieces)]
    else:
        start = {**block, "input": {}}
        arguments = json.dumps(block["input"], ensure_ascii=False)
        deltas = [
            {"type": "input_json_delta", "partial_json": part} for part in _split(arguments, pieces)
        ]
    yield _sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": start},
    )
    for delta in deltas:
        yield _sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
