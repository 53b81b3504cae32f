"""From the policy's reply to an OpenEnv action, and from an observation to a chat turn.

An OpenEnv action is a JSON object that must validate against the server's action schema
(`GET /schema`). `ActionMapping.of(schema, tools)` picks one of three readings, in this order:

- **tools**: the environment answers `list_tools` with tools (an MCP environment, `call_tool` /
  `list_tools` actions). The reply's tool calls, written the way the chat template writes them
  (`--env.tool_parser`, default Hermes `<tool_call>{"name", "arguments"}</tool_call>`), are one
  `{"type": "call_tool", "tool_name", "arguments"}` step each, their results the tool turns
  that follow. A reply without calls is the final answer: it is stepped as a text action when
  the schema also has a text field, else the episode ends there.
- **text**: the schema has one string field the action needs (the one required string field,
  else the only string field; `--env.action_field` names it when there are several): the
  action is `{field: reply}`, the reply after its think block.
- **json**: anything else. The reply (after its think block, a ```json fence allowed) must be
  one JSON object, stepped as it is.

A reply that cannot be read as an action (no JSON object, or one the server's schema refuses)
is not sent as a step: the policy gets a user turn saying what is wrong and may try again
within `max_turns` (it counts as a turn, with reward 0).

Observations become text: the one string field of the observation when it has one (or the
first of `prompt`, `text`, `message`, `content`, `observation` that is a string), else the
observation as compact JSON. A tool's observation (`tool_name`, `result`, `error`) becomes the
result's text content (or `error: <message>`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from atropos.inference.tool_calls import parse_tool_calls

__all__ = ["ActionMapping", "Reading", "observation_text", "tool_result_text"]

TEXT_KEYS = ("prompt", "text", "message", "content", "observation", "question")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_THINK_END = "</think>"


def _answer(reply: str) -> str:
    """The reply after its last `</think>` (all of it when it has none), stripped."""
    return reply.rsplit(_THINK_END, 1)[-1].strip()


def _string_fields(schema: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(string fields, required string fields) of an action schema, `metadata` left out."""
    props = schema.get("properties") or {}
    strings = [k for k, v in props.items() if k != "metadata" and v.get("type") == "string"]
    required = [k for k in schema.get("required") or [] if k in strings]
    return strings, required


@dataclass(frozen=True)
class Reading:
    """What one reply is: `actions` to step in order, or `problem` (why it is none), or
    neither (`final`: a tool environment's answer without calls and no text field)."""

    actions: list[dict[str, Any]]
    problem: str | None = None
    calls: int = 0


@dataclass(frozen=True)
class ActionMapping:
    """How replies become actions (module docstring): `mode` is tools, text or json."""

    mode: str
    field: str | None = None
    parser: str = "hermes"

    @classmethod
    def of(
        cls, schema: dict[str, Any], tools: bool, field: str = "", parser: str = "hermes"
    ) -> ActionMapping:
        """The mapping for an action schema; `field` picks the text field when set.

        >>> ActionMapping.of({"properties": {"message": {"type": "string"}}}, False).field
        'message'
        >>> ActionMapping.of({"properties": {"x": {"type": "integer"}}}, False).mode
        'json'
        """
        strings, required = _string_fields(schema)
        if field and field not in strings:
            raise ValueError(
                f"openenv: --env.action_field {field!r} is not a string field of the action"
                f" (its string fields: {strings or 'none'})"
            )
        chosen = field or (required[0] if len(required) == 1 else None)
        if chosen is None and len(strings) == 1:
            chosen = strings[0]
        if tools:
            return cls("tools", chosen, parser)
        return cls("text", chosen, parser) if chosen else cls("json", None, parser)

    def read(self, reply: str) -> Reading:
        """The actions of one reply (module docstring)."""
        if self.mode == "tools":
            parsed = parse_tool_calls(reply, self.parser)
            calls = [_call_action(c) for c in parsed.tool_calls]
            if parsed.malformed and not calls:
                return Reading([], 'a tool call could not be read: write {"name": ..., '
                               '"arguments": {...}} as JSON')  # fmt: skip
            if calls:
                return Reading(calls, calls=len(calls))
            return Reading([{self.field: _answer(reply)}] if self.field else [])
        if self.mode == "text" and self.field:
            return Reading([{self.field: _answer(reply)}])
        return _json_action(reply)


def _call_action(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "type": "call_tool",
        "tool_name": function["name"],
        "arguments": json.loads(function.get("arguments") or "{}"),
    }


def _json_action(reply: str) -> Reading:
    text = _answer(reply)
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        action = json.loads(text)
    except ValueError:
        action = None
    if not isinstance(action, dict):
        return Reading([], "the reply must be one JSON object: the action, as the schema says")
    return Reading([action])


def observation_text(observation: dict[str, Any]) -> str:
    """An observation as the user turn that shows it (module docstring).

    >>> observation_text({"echoed_message": "hi", "length": 2})
    'hi'
    >>> observation_text({"board": [1, 2]})
    '{"board":[1,2]}'
    """
    strings = [k for k, v in observation.items() if isinstance(v, str)]
    if len(strings) == 1:
        return str(observation[strings[0]])
    for key in TEXT_KEYS:
        if isinstance(observation.get(key), str):
            return str(observation[key])
    return json.dumps(observation, separators=(",", ":"), ensure_ascii=False, default=str)


def tool_result_text(observation: dict[str, Any]) -> str:
    """A tool observation's result as the tool turn's text (or `error: ...`)."""
    error = observation.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return f"error: {message}"
    result = observation.get("result")
    if isinstance(result, dict):
        content = result.get("content")
        if isinstance(content, list):
            texts = [c.get("text") for c in content if isinstance(c, dict) and c.get("text")]
            if texts:
                return "\n".join(str(t) for t in texts)
        if "data" in result:
            result = result["data"]
    if isinstance(result, str):
        return result
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False, default=str)
