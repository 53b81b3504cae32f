"""The OpenAI Responses API (`POST /v1/responses`, the OpenAI Agents SDK's default) in the
proxy's terms: pure translation between its JSON and `TurnRequest`/`TurnResult`.

- `to_turn(body, history)` reads a request: `input` (a string, or message, `function_call`,
  `function_call_output` and skipped `reasoning` items), `instructions`, function `tools`,
  `tool_choice`, `max_output_tokens`, `temperature`, `top_p`, and `previous_response_id`, whose
  conversation `history` holds (the app keeps what `from_turn` returns under each response id).
- `from_turn(result, body, request)` writes the `response` object and the conversation to keep.
- `stream_events(response)` writes that response as the official event stream.
- `error_body(err)` writes OpenAI's error JSON.
- `compact_to_turn(body, history)` and `compacted(result, request)`: `POST
  /v1/responses/compact` (context compaction), below.

As in the official API, `instructions` are not carried over to a response that continues from
`previous_response_id`: the kept conversation leaves them out. A completion cut at the token
limit is `status: "incomplete"` (`incomplete_details.reason: "max_output_tokens"`) and its stream
ends with `response.incomplete` instead of `response.completed`.

Compaction (`/v1/responses/compact`: `model`, `input`, `instructions`, `previous_response_id`)
is a model call in the session: the conversation, then a user turn asking for a summary
(`COMPACT_PROMPT`; no tools, so the call's prompt extends no held sequence), and the policy's
answer is the summary (its tokens trained like any other). The answer is OpenAI's
`response.compaction` object: the conversation's user messages, then one `compaction` item whose
`encrypted_content` carries the summary (`atropos-compaction-v1:` and its base64: opaque to the
client, readable by this proxy only; OpenAI's encrypts it). A later `input` holding that item
reads it as a user message, `SUMMARY_PREFIX` and the summary; a `compaction` item this proxy did
not make is a 400. The conversation that follows a compaction is shorter than the one before:
it starts a new sequence (a break, as any harness that compacts its context makes).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from atropos.proxy import fields
from atropos.proxy.turns import ProxyError, TurnChoice, TurnRequest, TurnResult

__all__ = [
    "COMPACT_PROMPT",
    "SUMMARY_PREFIX",
    "ResponsesError",
    "compact_to_turn",
    "compacted",
    "error_body",
    "from_turn",
    "stream_events",
    "to_turn",
]

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_DELTAS = 3  # pieces a streamed text or arguments string is cut into
COMPACT_PROMPT = (
    "Summarize the conversation so far for whoever continues it: the task, what has been done,"
    " what was found, and what is left to do. Answer with the summary only."
)
SUMMARY_PREFIX = "Summary of the conversation so far:\n"
_COMPACTION = "atropos-compaction-v1:"  # how this proxy's compaction items start


class ResponsesError(ProxyError):
    """A `ProxyError` made with the request field at fault (`param`, e.g. `input[2].call_id`)
    and OpenAI's machine-readable `code` as its third and fourth arguments."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(status, message, kind, param, code)


def _bad(message: str, param: str | None = None) -> ResponsesError:
    return ResponsesError(400, message, param)


# ---------------------------------------------------------------------------------------------
# Request


def to_turn(
    body: Mapping[str, Any], history: Mapping[str, list[dict[str, Any]]] | None = None
) -> TurnRequest:
    """Validate a Responses request body and translate it into a `TurnRequest`.

    Args:
        body: the decoded JSON body; unknown fields are ignored.
        history: earlier responses' conversations by response id (what `from_turn` returned),
            read when the body names a `previous_response_id`.

    Raises:
        ResponsesError: 400 for a missing, ill-typed or unsupported field (images, hosted tools,
            `conversation`, ...), 404 for a `previous_response_id` that `history` lacks.

    >>> turn = to_turn({"model": "m", "input": "Hi", "instructions": "Be brief."})
    >>> turn.messages
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    """
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object with `model` and `input`")
    _check_scalars(body)
    messages = _previous(body.get("previous_response_id"), history or {})
    messages += _input_messages(body.get("input"), messages)
    if not messages:
        raise _bad(
            "`input` is required: a string or a list of input items (or `previous_response_id`"
            " naming the response to continue)",
            "input",
        )
    instructions = body.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    tools = _tools(body.get("tools"))
    return TurnRequest(
        messages=messages,
        tools=tools or None,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        max_tokens=body.get("max_output_tokens"),
        sampling={k: body[k] for k in ("temperature", "top_p") if body.get(k) is not None},
    )


def _check_scalars(body: Mapping[str, Any]) -> None:
    """The top-level fields that are not input or tools: types, ranges, unsupported ones."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("`model` is required: the name of the model to answer (a string)", "model")
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise _bad(
                f"`{name}` is not supported by this proxy: send the whole conversation as"
                " `input`, or continue one with `previous_response_id`",
                name,
            )
    for name, kind, types in (
        ("instructions", "a string", (str,)),
        ("previous_response_id", "a string", (str,)),
        ("stream", "a boolean", (bool,)),
        ("store", "a boolean", (bool,)),
        ("parallel_tool_calls", "a boolean", (bool,)),
    ):
        if body.get(name) is not None and not isinstance(body[name], types):
            raise _bad(f"`{name}` must be {kind}, got {fields.shown(body[name])}", name)
    fields.integer(body, "max_output_tokens", 1, fields.MAX_TOKENS)
    fields.mapping(body, "metadata")
    for name, top in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
            raise _bad(
                f"`{name}` must be a number from 0 to {top:g}, got {fields.shown(value)}", name
            )


def _previous(
    response_id: str | None, history: Mapping[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """A copy of the conversation `response_id` continues ([] without one)."""
    if response_id is None:
        return []
    if response_id not in history:
        raise ResponsesError(
            404,
            f"previous response {response_id!r} not found: it was never made by this proxy, was"
            " made with `store: false`, or belongs to an ended session; send the whole"
            " conversation as `input` instead",
            "previous_response_id",
            "previous_response_not_found",
        )
    return [dict(message) for message in history[response_id]]


def _input_messages(value: Any, before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of `input`; `before` (the earlier conversation) is only read."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad(
            f"`input` must be a string or a list of items, got {fields.shown(value)}", "input"
        )
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise _bad(
                f"{where} must be an object (a message or an item), got {fields.shown(item)}", where
            )
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _add_call(messages, _call(item, where))
        elif kind == "function_call_output":
            messages.append(_call_output(item, where, before + messages))
        elif kind == "compaction":
            messages.append({"role": "user", "content": SUMMARY_PREFIX + _summary(item, where)})
        elif kind != "reasoning":  # reasoning items are the model's own notes: not re-sent
            raise _bad(
                f"{where} has type {kind!r}: the proxy reads only `message`, `function_call`,"
                " `function_call_output`, `compaction` and `reasoning` items",
                f"{where}.type",
            )
    return messages


def _summary(item: Mapping[str, Any], where: str) -> str:
    """The summary a compaction item of this proxy carries."""
    content = item.get("encrypted_content")
    if isinstance(content, str) and content.startswith(_COMPACTION):
        try:
            return base64.b64decode(content[len(_COMPACTION) :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            pass
    raise _bad(
        f"{where} is a compaction item this proxy did not make (its `encrypted_content` is not"
        " one of ours): send the items `/v1/responses/compact` of this proxy answered, or the"
        " conversation itself",
        f"{where}.encrypted_content",
    )


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(
            f"{where}.role must be one of user, assistant, system, developer; got"
            f" {fields.shown(role)}",
            f"{where}.role",
        )
    return {"role": _ROLES[role], "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """The text of a message's (or a call output's) content: a string or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(
            f"{where} must be a string or a list of content parts, got {fields.shown(content)}",
            where,
        )
    texts = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_PARTS:
            raise _bad(
                f"{at} is an {kind} part: the proxy serves text-only models; send `input_text`"
                " parts only",
                f"{at}.type",
            )
        field = "refusal" if kind == "refusal" else "text"
        if kind not in (*_TEXT_PARTS, "refusal") or not isinstance(part.get(field), str):
            raise _bad(
                f"{at} must be a text part ({{type: input_text|output_text, text: str}}), got"
                f" {fields.shown(part)}",
                at,
            )
        texts.append(part[field])
    return "\n".join(texts)


def _call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The OpenAI chat tool call of a `function_call` item."""
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str) or (name != "arguments" and not item[name]):
            raise _bad(
                f"{where} is a function_call without a string `{name}`: send the item as the"
                " response gave it ({type, call_id, name, arguments})",
                f"{where}.{name}",
            )
    function = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": function}


def _add_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Put `call` on the assistant message just before it, or on a new one: a response's text
    and calls come back as separate items, but were one assistant turn."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        messages[-1] = {
            "role": "assistant",
            "content": last["content"] or None,
            "tool_calls": [*last.get("tool_calls", []), call],
        }
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(
    item: Mapping[str, Any], where: str, before: list[dict[str, Any]]
) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(
            f"{where} is a function_call_output without a string `call_id`", f"{where}.call_id"
        )
    called = {c["id"] for m in before for c in m.get("tool_calls") or ()}
    if call_id not in called:
        raise _bad(
            f"{where} answers call {call_id!r}, but no function_call with that call_id comes"
            " before it: send the function_call item first, or continue with"
            " `previous_response_id` from the response that made the call",
            f"{where}.call_id",
        )
    if "output" not in item:
        raise _bad(f"{where} is a function_call_output without `output`", f"{where}.output")
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": _text(item["output"], f"{where}.output"),
    }


def _tools(value: Any) -> list[dict[str, Any]]:
    """OpenAI chat function tools of the request's `tools`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"`tools` must be a list of function tools, got {fields.shown(value)}", "tools")
    tools: list[dict[str, Any]] = []
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise _bad(
                f"{where} has type {kind!r}: the proxy serves only function tools ({{type:"
                " function, name, parameters}}); define it as a function or leave it out",
                f"{where}.type",
            )
        name, description = tool.get("name"), tool.get("description")
        parameters = tool.get("parameters")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where} needs a `name` (a non-empty string)", f"{where}.name")
        if any(t["function"]["name"] == name for t in tools):
            raise _bad(f"{where} repeats the tool name {name!r}: names must be unique", where)
        if description is not None and not isinstance(description, str):
            raise _bad(f"{where}.description must be a string", f"{where}.description")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise _bad(f"{where}.parameters must be a JSON schema object", f"{where}.parameters")
        function = {
            "name": name,
            "description": description or "",
            "parameters": dict(parameters or _EMPTY_SCHEMA),
        }
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> Any:
    """TurnRequest's tool_choice of the request's (None: the default, auto)."""
    if value is None or value in ("auto", "none"):
        return value
    names = [tool["function"]["name"] for tool in tools]
    if value == "required":
        if not tools:
            raise _bad("`tool_choice` is 'required' but no `tools` are given", "tool_choice")
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        if value.get("name") not in names:
            raise _bad(
                f"`tool_choice` names the function {value.get('name')!r}, which is not among"
                f" `tools` ({', '.join(names) or 'none given'})",
                "tool_choice.name",
            )
        return {"type": "function", "function": {"name": value["name"]}}
    raise _bad(
        "`tool_choice` must be 'auto', 'none', 'required' or {type: 'function', name}; got"
        f" {fields.shown(value)}",
        "tool_choice",
    )


# ---------------------------------------------------------------------------------------------
# Answer


def from_turn(
    result: TurnResult, body: Mapping[str, Any], request: TurnRequest
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The `response` object of a result, and the conversation to keep under its id.

    Args:
        result: what the session generated (its first choice answers; Responses has no `n`).
        body: the request body (`to_turn` accepted it): echoed fields such as `tools`.
        request: what `to_turn` made of it.

    Returns:
        The response JSON, and the conversation (request messages without `instructions`, plus
        the assistant's answer) for a later `previous_response_id`. Keep it only when
        `body.get("store")` is not False.
    """
    choice = result.choices[0]
    incomplete = choice.finish_reason == "length"
    now = int(time.time())
    response: dict[str, Any] = {
        "id": f"resp_{secrets.token_hex(24)}",
        "object": "response",
        "created_at": now,
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "completed_at": None if incomplete else now,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "metadata": dict(body["metadata"]) if isinstance(body.get("metadata"), Mapping) else {},
        "model": result.model,
        "output": _output(choice, "incomplete" if incomplete else "completed"),
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store") is not False,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [_echo_tool(tool) for tool in body.get("tools") or ()],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": _usage(result),
        "user": None,
    }
    kept = request.messages[1:] if body.get("instructions") else request.messages
    return response, [*kept, choice.message()]


def _output(choice: TurnChoice, status: str) -> list[dict[str, Any]]:
    """A `message` item with the text (unless the choice is only calls), then a
    `function_call` item per call."""
    items: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        part = {"type": "output_text", "text": choice.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "id": f"msg_{secrets.token_hex(24)}",
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for call in choice.tool_calls:
        items.append(
            {
                "id": f"fc_{secrets.token_hex(24)}",
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items


def _echo_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict", True),
    }


def _usage(result: TurnResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


# ---------------------------------------------------------------------------------------------
# Compaction


def compact_to_turn(
    body: Mapping[str, Any], history: Mapping[str, list[dict[str, Any]]] | None = None
) -> TurnRequest:
    """A `/v1/responses/compact` body as the call that writes the summary: its conversation
    (as `to_turn` reads it, with no tools) and `COMPACT_PROMPT` after it.

    Raises:
        ResponsesError: as `to_turn`.

    >>> compact_to_turn({"model": "m", "input": "Fix a.py"}).messages[-1]["content"][:9]
    'Summarize'
    """
    if isinstance(body, Mapping):
        body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "stream")}
    request = to_turn(body, history)
    messages = [*request.messages, {"role": "user", "content": COMPACT_PROMPT}]
    return TurnRequest(messages=messages, sampling=request.sampling)


def compacted(result: TurnResult, request: TurnRequest) -> dict[str, Any]:
    """The `response.compaction` object of a summary: the conversation's user messages, then
    the `compaction` item carrying the summary (`result`'s first choice)."""
    users = [m for m in request.messages[:-1] if m["role"] == "user"]
    output: list[dict[str, Any]] = [
        {
            "id": f"msg_{secrets.token_hex(24)}",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_text", "text": message["content"]}],
        }
        for message in users
    ]
    summary = base64.b64encode(result.choices[0].content.encode()).decode()
    output.append(
        {
            "id": f"cmp_{secrets.token_hex(24)}",
            "type": "compaction",
            "encrypted_content": _COMPACTION + summary,
        }
    )
    return {
        "id": f"resp_{secrets.token_hex(24)}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": _usage(result),
    }


# ---------------------------------------------------------------------------------------------
# Stream

_Emit = Callable[..., bytes]


def stream_events(response: Mapping[str, Any]) -> Iterator[bytes]:
    """The server-sent events of a finished `response` (from `from_turn`), in the official order.

    `response.created` and `response.in_progress` (the response with no output yet), then per
    output item `response.output_item.added`, its content (a message's text part, or a call's
    arguments) in a few deltas and their `.done`, `response.output_item.done`; last
    `response.completed` (or `response.incomplete` when cut at the token limit). Every event
    carries its `sequence_number`.
    """
    numbers = itertools.count()

    def emit(kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": next(numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    started = {
        **response,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "completed_at": None,
        "incomplete_details": None,
    }
    yield emit("response.created", response=started)
    yield emit("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            yield from _message_events(emit, index, item)
        else:
            yield from _call_events(emit, index, item)
    ending = {"completed": "completed", "incomplete": "incomplete"}.get(
        response["status"], "failed"
    )
    yield emit(f"response.{ending}", response=response)


def _message_events(emit: _Emit, index: int, item: Mapping[str, Any]) -> Iterator[bytes]:
    ids = {"item_id": item["id"], "output_index": index}
    yield emit(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "content": []},
    )
    for content_index, part in enumerate(item["content"]):
        at = {**ids, "content_index": content_index}
        yield emit("response.content_part.added", **at, part={**part, "text": ""})
        for piece in _pieces(part["text"]):
            yield emit("response.output_text.delta", **at, delta=piece, logprobs=[])
        yield emit("response.output_text.done", **at, text=part["text"], logprobs=[])
        yield emit("response.content_part.done", **at, part=part)
    yield emit("response.output_item.done", output_index=index, item=item)


def _call_events(emit: _Emit, index: int, item: Mapping[str, Any]) -> Iterator[bytes]:
    ids = {"item_id": item["id"], "output_index": index}
    yield emit(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "arguments": ""},
    )
    for piece in _pieces(item["arguments"]):
        yield emit("response.function_call_arguments.delta", **ids, delta=piece)
    yield emit("response.function_call_arguments.done", **ids, arguments=item["arguments"])
    yield emit("response.output_item.done", output_index=index, item=item)


def _pieces(text: str) -> list[str]:
    """`text` cut into at most `_DELTAS` consecutive pieces (none for "").

    >>> _pieces("abcdefg")
    ['abc', 'def', 'g']
    """
    size = max(1, -(-len(text) // _DELTAS))
    return [text[at : at + size] for at in range(0, len(text), size)]


# ---------------------------------------------------------------------------------------------
# Errors


def error_body(err: ProxyError) -> dict[str, Any]:
    """OpenAI's error JSON for `err` (`param` and `code` where it is a `ResponsesError`).

    >>> error_body(ProxyError(401, "bad key", "authentication_error"))
    {'error': {'message': 'bad key', 'type': 'authentication_error', 'param': None, 'code': None}}
    """
    return {
        "error": {
            "message": err.message,
            "type": err.kind,
            "param": err.param,
            "code": err.code,
        }
    }
