"""Tool calls in a model's raw output: read into OpenAI `tool_calls`, and written back.

A policy that calls tools writes them as text in its chat template's format; serving it behind
an OpenAI or Anthropic API means reading that text into structured calls, and training on it
means the structured calls an agent sends back must render to the very same text. Formats, by
the name vLLM's `--tool-call-parser` uses for them:

- `hermes` (Hermes, Qwen 2.5/3, the tiny policy): `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>` blocks anywhere after the reasoning;
- `llama3_json` (Llama 3.1+): the whole answer is one JSON object `{"name": ..., "parameters":
  {...}}` (or `"arguments"`), or several separated by `;`;
- `mistral`: `[TOOL_CALLS]` followed by a JSON list of `{"name", "arguments"}`.

A call that cannot be read (bad JSON, no name, arguments not an object) is never raised: its
text stays in the content and it is counted in `ParsedOutput.malformed`.

>>> out = parse_tool_calls('Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}'
...                        '</tool_call>', "hermes")
>>> out.content, [c["function"] for c in out.tool_calls], out.malformed
('Let me add.', [{'name': 'add', 'arguments': '{"a": 1}'}], 0)
>>> parse_tool_calls('<tool_call>{"name": 1}</tool_call>').malformed
1
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PARSERS",
    "ParsedOutput",
    "call_key",
    "new_call_id",
    "parse_tool_calls",
    "read_call",
]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_END = "</think>"
_MISTRAL = "[TOOL_CALLS]"


@dataclass
class ParsedOutput:
    """One completion read as an assistant message.

    Attributes:
        content: the text left once the readable calls are taken out (stripped).
        tool_calls: OpenAI-shaped calls, `{"id", "type": "function", "function": {"name",
            "arguments": <JSON string>}}`, in the order written.
        malformed: how many call-shaped pieces could not be read (left in `content`).
    """

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0


def new_call_id() -> str:
    """A fresh, unguessable tool call id (`call_` + 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


def read_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """`(name, arguments)` of one decoded call (OpenAI's `function` wrapper removed; arguments
    as an object, a JSON string of one, or llama's `parameters`); None when unreadable."""
    if isinstance(obj, Mapping) and isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(args, Mapping):
        return None
    return obj["name"], dict(args)


def _openai(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": text}}


def call_key(name: str, arguments: Any) -> str:
    """What identifies a call regardless of its id and JSON spelling (for matching echoes)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    return json.dumps([name, arguments], sort_keys=True, ensure_ascii=False, default=str)


def _hermes(text: str) -> ParsedOutput:
    head, tail = "", text
    if _THINK_END in text:  # calls come after the reasoning; a call-like text inside it is not one
        head, tail = text.rsplit(_THINK_END, 1)
        head += _THINK_END
    calls: list[dict[str, Any]] = []
    malformed = 0
    kept: list[str] = []
    at = 0
    for match in _HERMES.finditer(tail):
        try:
            call = read_call(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        kept.append(tail[at : match.start()])
        if call is None:
            malformed += 1
            kept.append(match.group(0))
        else:
            calls.append(_openai(*call))
        at = match.end()
    kept.append(tail[at:])
    rest = "".join(kept)
    malformed += max(0, rest.count("<tool_call>") - rest.count("</tool_call>"))
    return ParsedOutput((head + rest).strip(), calls, malformed)


def _json_objects(text: str) -> list[Any] | None:
    """The `;`-separated JSON values of `text`, or None when any does not decode."""
    found = []
    for piece in (p for p in text.split(";") if p.strip()):
        try:
            found.append(json.loads(piece))
        except json.JSONDecodeError:
            return None
    return found


def _llama3_json(text: str) -> ParsedOutput:
    stripped = text.strip().removeprefix("<|python_tag|>")
    if not stripped.startswith("{"):
        return ParsedOutput(text.strip())
    values = _json_objects(stripped)
    if not values:
        return ParsedOutput(text.strip(), [], 1)
    calls = [read_call(v) for v in values]
    if any(c is None for c in calls):
        return ParsedOutput(text.strip(), [], 1)
    return ParsedOutput("", [_openai(*c) for c in calls if c is not None])


def _mistral(text: str) -> ParsedOutput:
    if _MISTRAL not in text:
        return ParsedOutput(text.strip())
    head, payload = text.split(_MISTRAL, 1)
    try:
        values = json.loads(payload.strip())
    except json.JSONDecodeError:
        return ParsedOutput(text.strip(), [], 1)
    values = values if isinstance(values, list) else [values]
    calls = [read_call(v) for v in values]
    if not calls or any(c is None for c in calls):
        return ParsedOutput(text.strip(), [], 1)
    return ParsedOutput(head.strip(), [_openai(*c) for c in calls if c is not None])


PARSERS: dict[str, Callable[[str], ParsedOutput]] = {
    "hermes": _hermes,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
}
"""The formats read, by vLLM's parser names."""


def parse_tool_calls(text: str, parser: str = "hermes") -> ParsedOutput:
    """Read `text` (a completion) as content plus tool calls in the format `parser` names.

    Raises:
        ValueError: `parser` is not one of `PARSERS`.
    """
    try:
        read = PARSERS[parser]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {parser!r}: use one of {', '.join(PARSERS)}"
        ) from None
    return read(text)
