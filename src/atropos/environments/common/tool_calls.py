"""Tool calls: parse them from a completion and match them against the expected ones.

Two native formats are read: Hermes blocks in the text (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`) and OpenAI `tool_calls` (`[{"type": "function", "function": {"name": ...,
"arguments": "<JSON string>"}}]`), either in a message dict or in a completion whose text is
such a message as JSON. Arguments given as a JSON string are decoded. A block or entry that
cannot be read (bad JSON, no name, arguments not an object) is a *malformed* call: counted,
never raised. Matching and scoring follow `docs/tool_calling.md`.

>>> parsed = parse_text('<tool_call>{"name": "f", "arguments": {"x": 3}}</tool_call><tool_call>{')
>>> parsed.calls, parsed.malformed
([{'name': 'f', 'arguments': {'x': 3}}], 1)
>>> score_calls([{"name": "f", "arguments": {"x": 3}}], parsed)
-1.0
>>> score_calls([{"name": "f", "arguments": {"x": 3}}], parsed, partial=True)
0.0
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atropos.inference.tool_calls import read_call

__all__ = [
    "ParsedCalls",
    "count_matched",
    "matches",
    "parse_completion",
    "parse_message",
    "parse_openai",
    "parse_text",
    "same_value",
    "score_calls",
]

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"
_THINK_END = "</think>"


@dataclass
class ParsedCalls:
    """The calls read from one answer, each `{"name": str, "arguments": ...}`, and how many
    calls could not be read."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0

    def __add__(self, other: ParsedCalls) -> ParsedCalls:
        return ParsedCalls(self.calls + other.calls, self.malformed + other.malformed)


def _normalize(obj: Any) -> dict[str, Any] | None:
    """`{"name", "arguments"}` from a decoded call (`atropos.inference.tool_calls.read_call`:
    OpenAI's `function` wrapper removed, JSON-string arguments decoded), or None when it is not
    a readable call. Other keys are kept."""
    found = read_call(obj)
    if found is None:
        return None
    inner = obj["function"] if isinstance(obj.get("function"), Mapping) else obj
    return {**inner, "name": found[0], "arguments": found[1]}


def parse_text(text: str) -> ParsedCalls:
    """The Hermes `<tool_call>` blocks of `text` (after the last `</think>` when there is one);
    an unclosed `<tool_call>` counts as malformed."""
    if _THINK_END in text:
        text = text.rsplit(_THINK_END, 1)[1]
    out = ParsedCalls()
    blocks = _BLOCK.findall(text)
    for block in blocks:
        try:
            call = _normalize(json.loads(block))
        except json.JSONDecodeError:
            call = None
        if call is None:
            out.malformed += 1
        else:
            out.calls.append(call)
    out.malformed += max(0, text.count(_OPEN) - len(blocks))
    return out


def parse_openai(tool_calls: Any) -> ParsedCalls:
    """OpenAI `tool_calls` (a list of `{"type": "function", "function": {"name", "arguments"}}`;
    bare `{"name", "arguments"}` entries are read too)."""
    out = ParsedCalls()
    for entry in tool_calls if isinstance(tool_calls, list) else [tool_calls]:
        call = _normalize(entry)
        if call is None:
            out.malformed += 1
        else:
            out.calls.append(call)
    return out


def parse_message(message: Mapping[str, Any]) -> ParsedCalls:
    """The calls of an assistant message dict: its `tool_calls` plus Hermes blocks in `content`."""
    content = message.get("content")
    parsed = parse_text(content) if isinstance(content, str) else ParsedCalls()
    if message.get("tool_calls"):
        parsed = parse_openai(message["tool_calls"]) + parsed
    return parsed


def parse_completion(text: str) -> ParsedCalls:
    """The calls of a completion: a JSON message with `tool_calls` (e.g. a server's parsed
    reply, serialized), else Hermes blocks in the text."""
    stripped = text.strip()
    if stripped.startswith("{") and '"tool_calls"' in stripped:
        try:
            message = json.loads(stripped)
        except json.JSONDecodeError:
            message = None
        if isinstance(message, dict) and "tool_calls" in message:
            return parse_message(message)
    return parse_text(text)


def same_value(expected: Any, actual: Any, lenient: bool = False) -> bool:
    """Equality that respects JSON types: `"3"` is not `3`, `true` is not `1` (but `3` is
    `3.0`); dicts need the same keys, lists the same order. `lenient` lets a string equal a
    number or boolean it spells (`"3"` and `3`, `"true"` and `true`).

    >>> same_value(3, "3"), same_value(3, "3", lenient=True)
    (False, True)
    >>> same_value(1, True), same_value(2, 2.0)
    (False, True)
    """
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return expected.keys() == actual.keys() and all(
            same_value(v, actual[k], lenient) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(
            same_value(e, a, lenient) for e, a in zip(expected, actual, strict=True)
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        if type(expected) is type(actual):
            return bool(expected == actual)
        return lenient and _spelled(expected, actual)
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(actual, numbers):
        return bool(expected == actual)
    if type(expected) is type(actual):
        return bool(expected == actual)
    return lenient and _spelled(expected, actual)


def _spelled(a: Any, b: Any) -> bool:
    """Whether one of `a`, `b` is a string spelling the other scalar (`"2.50"` for 2.5)."""
    text, value = (a, b) if isinstance(a, str) else (b, a)
    if not isinstance(text, str) or isinstance(value, (str, Mapping, list)) or value is None:
        return False
    if isinstance(value, bool):
        return text.strip().lower() == json.dumps(value)
    try:
        return bool(float(text) == value)
    except ValueError:
        return False


def matches(expected: Mapping[str, Any], actual: Mapping[str, Any], lenient: bool = False) -> bool:
    """Upstream's rule: every key of `expected` is in `actual`; where the expected value is a
    dict (`arguments`), every expected sub-key is present with an equal value (`same_value`);
    other values are equal. Extra keys and extra arguments in `actual` are allowed."""
    for key, want in expected.items():
        if key not in actual:
            return False
        got = actual[key]
        if isinstance(want, Mapping):
            if not isinstance(got, Mapping):
                return False
            if any(k not in got or not same_value(v, got[k], lenient) for k, v in want.items()):
                return False
        elif not same_value(want, got, lenient):
            return False
    return True


def count_matched(
    expected: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]], lenient: bool = False
) -> int:
    """The most expected calls that can be paired one-to-one with matching calls, in any order
    (a maximum bipartite matching, so a loose match never steals a call a stricter one needs)."""
    owner: dict[int, int] = {}  # expected index -> call index

    def assign(c: int, seen: set[int]) -> bool:
        for e, want in enumerate(expected):
            if e in seen or not matches(want, calls[c], lenient):
                continue
            seen.add(e)
            if e not in owner or assign(owner[e], seen):
                owner[e] = c
                return True
        return False

    return sum(assign(c, set()) for c in range(len(calls)))


def score_calls(
    expected: Sequence[Mapping[str, Any]],
    parsed: ParsedCalls,
    partial: bool = False,
    lenient: bool = False,
) -> float:
    """+1.0 when the calls and `expected` match one-to-one with nothing extra, else -1.0; with
    `partial`, `2 * k / (E + X) - 1` for k matched of E expected calls and X extra calls
    (unmatched or malformed), which lies in [-1, 1] and is 1.0 only for an exact answer."""
    matched = count_matched(expected, parsed.calls, lenient)
    extra = len(parsed.calls) - matched + parsed.malformed
    if not partial:
        return 1.0 if matched == len(expected) and extra == 0 else -1.0
    denominator = len(expected) + extra
    return 2.0 * matched / denominator - 1.0 if denominator else 1.0
