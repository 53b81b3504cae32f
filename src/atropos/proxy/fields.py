"""Request bodies and their fields, checked where the dialects read them: a client's mistake is a
400 that names the field (`ProxyError.param`), never an exception that escapes as a 5xx.

`decode` reads a body as a JSON object: bytes that are not UTF-8, not JSON, or nested deeper than
`MAX_DEPTH` are a 400 ("the body is nested too deeply", ...). The field readers (`integer`,
`number`, `boolean`, `string`, `mapping`) return a field's value, or None when it is absent or
null (`at` names the object it is in: `stream_options`, `messages[2]`), and refuse a value of
the wrong type or out of range with a message such as "max_tokens: expected an integer from 1
to 2147483647, got 18446744073709551616".

>>> integer({"n": 2}, "n", 1, 64)
2
>>> integer({"n": True}, "n", 1, 64)
Traceback (most recent call last):
...
atropos.proxy.turns.ProxyError: n: expected an integer from 1 to 64, got True
>>> decode(b"[" * 100_000)
Traceback (most recent call last):
...
atropos.proxy.turns.ProxyError: the body is nested too deeply (more than 64 levels): flatten it
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from atropos.proxy.turns import ProxyError

__all__ = [
    "MAX_DEPTH",
    "MAX_SEED",
    "MAX_TOKENS",
    "boolean",
    "check_depth",
    "decode",
    "integer",
    "mapping",
    "number",
    "shown",
    "string",
]

MAX_DEPTH = 64  # JSON nesting a body may have (a tool's JSON schema rarely passes 10)
MAX_TOKENS = 2**31 - 1  # the most tokens a request may ask for (servers read an int32)
MAX_SEED = 2**63 - 1
_DECODER = msgspec.json.Decoder()


def decode(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object ({} when empty); ProxyError 400 when it is not one."""
    if not raw:
        return {}
    try:
        body = _DECODER.decode(raw)
    except RecursionError:
        raise _too_deep() from None
    except UnicodeError:
        raise ProxyError(400, "the body is not valid UTF-8: send UTF-8 JSON") from None
    except msgspec.DecodeError as err:
        raise ProxyError(400, f"the body is not JSON: {str(err)[:200]}") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "the body must be a JSON object")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:  # else it cannot be too deep
        check_depth(body)
    return body


def _too_deep() -> ProxyError:
    return ProxyError(
        400, f"the body is nested too deeply (more than {MAX_DEPTH} levels): flatten it"
    )


def check_depth(body: Any, depth: int = 1) -> None:
    """ProxyError 400 when `body` (at `depth` in its request) nests more than `MAX_DEPTH`
    containers (an iterative walk: the translation, templates and JSON encoders that read the
    body later recurse)."""
    stack: list[tuple[Any, int]] = [(body, depth)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))


def shown(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (a message never echoes a whole body)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(name: str, expected: str, value: Any, at: str = "") -> ProxyError:
    name = f"{at}.{name}" if at else name
    return ProxyError(400, f"{name}: expected {expected}, got {shown(value)}", param=name)


def integer(body: Mapping[str, Any], name: str, low: int, high: int, at: str = "") -> int | None:
    """The integer field `name` (None when absent or null), from `low` to `high`."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(name, f"an integer from {low} to {high}", value, at)
    return value


def number(
    body: Mapping[str, Any], name: str, low: float, high: float, at: str = ""
) -> float | None:
    """The number field `name` (None when absent or null), from `low` to `high`."""
    value = body.get(name)
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, (bool, str)) else math.nan
    except (TypeError, OverflowError):  # not a number; an integer past the floats
        number = math.nan
    if not math.isfinite(number) or not low <= number <= high:  # nan fails both
        span = f"from {low:g} to {high:g}" if math.isfinite(low + high) else "(finite)"
        raise _bad(name, f"a number {span}", value, at)
    return number


def boolean(body: Mapping[str, Any], name: str, at: str = "") -> bool | None:
    """The boolean field `name` (None when absent or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _bad(name, "true or false", value, at)
    return value


def string(body: Mapping[str, Any], name: str, at: str = "") -> str | None:
    """The string field `name` (None when absent or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _bad(name, "a string", value, at)
    return value


def mapping(body: Mapping[str, Any], name: str, at: str = "") -> Mapping[str, Any] | None:
    """The object field `name` (None when absent or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, Mapping):
        raise _bad(name, "an object", value, at)
    return value
