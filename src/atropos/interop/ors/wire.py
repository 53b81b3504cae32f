"""The Open Reward Standard on the wire: SSE events, tool specs, blocks, errors.

What `openreward` 0.1.167 (`openreward.environments.server` and its client) sends and expects,
written down once for our client and our server:

- Routes: `GET /list_environments`, `GET /{env}/splits` (`[{"name", "type"}]`, type one of
  train/validation/test), `POST /{env}/num_tasks|task|task_range|tasks` (`{"split", ...}`),
  `GET /{env}/tools` (`{"tools": [{"name", "description", "input_schema"}], "terminal_tool"}`).
- A session: `POST /create_session` answers an SSE stream whose `task_id` event is the session
  id; `POST /create` with `X-Session-ID` and `{"env_name", "split", "index"}` (or a
  `task_spec`) makes the environment; `GET /{env}/prompt` (blocks), `GET /{env}/task_tools`,
  `POST /{env}/call` `{"name", "input"}`, `POST /ping`, then `POST /delete` and
  `POST /delete_session`.
- `/call` answers SSE: `task_id`, then the JSON result in `chunk`s closed by `end` (or one
  `error` event when the tool raised). The result is `{"ok": true, "output": {"blocks",
  "metadata", "reward", "finished"}}` or `{"ok": false, "error", "reason"}`.
- A key, when the server wants one, comes as `X-API-Key` (our servers also take
  `Authorization: Bearer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from atropos.envs.outcome import RolloutFailed

__all__ = [
    "CHUNK",
    "ORSError",
    "blocks_text",
    "openai_tools",
    "read_sse",
    "sse_event",
    "sse_result",
    "text_blocks",
]

CHUNK = 4096  # the official server's chunk size for an SSE result


class ORSError(RolloutFailed):
    """The remote ORS environment failed (unreachable, a 5xx, a timeout, a tool that raised):
    an infrastructure failure (`RolloutFailed`, as `OpenEnvError`), counted as
    `failed/<failure_kind>` and never scored."""

    def __init__(self, failure_kind: str, detail: str) -> None:
        super().__init__(failure_kind, detail)


def sse_event(event: str, data: str) -> bytes:
    """One SSE event (every line of `data` a `data:` line)."""
    lines = "".join(f"data: {line}\r\n" for line in (data.split("\n") if data else [""]))
    return f"event: {event}\r\n{lines}\r\n".encode()


def sse_result(task_id: str, result: str) -> Iterator[bytes]:
    """The events answering a `/call`: its `task_id`, then `result` in chunks, the last `end`."""
    yield sse_event("task_id", task_id)
    pieces = [result[i : i + CHUNK] for i in range(0, len(result), CHUNK)] or [""]
    for n, piece in enumerate(pieces):
        yield sse_event("end" if n == len(pieces) - 1 else "chunk", piece)


def read_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs from an SSE stream's lines (comments and pings skipped).

    >>> list(read_sse(["event: task_id", "data: 7", "", ": ping", "event: end", "data: {}", ""]))
    [('task_id', '7'), ('end', '{}')]
    """
    event: str | None = None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if event:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)


def blocks_text(blocks: Iterable[Any]) -> str:
    """The text of ORS blocks (text blocks joined by newlines; an image is `[image]`)."""
    parts = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type", "text") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type')}]")
    return "\n".join(parts)


def text_blocks(text: str) -> list[dict[str, Any]]:
    """`text` as ORS blocks (one text block)."""
    return [{"type": "text", "text": text, "detail": None}]


def openai_tools(specs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """ORS tool specs as the OpenAI `tools` a chat template renders.

    >>> openai_tools([{"name": "add", "description": "Add.", "input_schema": None}])
    [{'type': 'function', 'function': {'name': 'add', 'description': 'Add.', 'parameters': \
{'type': 'object', 'properties': {}}}}]
    """
    tools = []
    for spec in specs:
        schema = spec.get("input_schema") or {"type": "object", "properties": {}}
        function = {"name": spec["name"], "description": spec.get("description") or ""}
        tools.append({"type": "function", "function": {**function, "parameters": schema}})
    return tools


def dumps(value: Any) -> str:
    """Compact JSON (no newline, so one SSE data line)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
