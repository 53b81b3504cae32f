"""Incoming groups, decoded once: the group to check and the bytes to store.

The API stores and serves a group as `wire.encode_group` writes it: every upstream key (null
when absent), then the extension keys that are set. Re-encoding costs about as much CPU as
decoding (a 8 x 512-token group: ~0.3 ms each), so a JSON group that already *is* that document
is stored as the bytes that came in, with only the absent upstream keys appended as nulls.
The fast path decodes with `_exact`, which accepts a group only when the bytes mean exactly
what re-encoding would write:

* no unknown keys (re-encoding drops them) and no value that needed lax coercion (strict
  decoding: "1" for 1 is refused);
* no integer where a float is due (re-encoding writes `1.0` for `1`, and a Python reader
  tells them apart): numbers there decode as `int | float` and any `int` sends the group to
  the re-encoding path (a scan in C: ~0.1 ms for 4,096 logprobs, a third of re-encoding);
* no free-form field (`wire.FREE_FORM`: messages, generation_params, overrides,
  group_overrides, images) other than null: msgspec may write their values back differently
  (a float out of range, a key order), so those groups take the re-encoding path;
* extension keys absent or set, never null (re-encoding omits a null one);
* no backslash anywhere: every string is plain UTF-8 (checked before), so no escape can
  mean something the encoder would write differently.

Whitespace between values (`json.dumps` writes ", " and ": ") is taken out with one
`bytes.translate` (~60 us for 8 x 512 tokens, a quarter of re-encoding): the only strings a
fast-path group holds are its keys and its extension names, and a name with whitespace in it
sends the group to re-encoding, so every whitespace byte is structural. Stored bodies stay as
compact as re-encoded ones (smaller segments and `/batch` answers: spaced bodies made `/batch`
cost 15% more CPU).

Anything else (msgpack bodies included) is decoded as before and re-encoded. Both paths give
the same `Group`, so every check downstream is unchanged; a stored document differs only in
key order, which no JSON reader sees. A list (`/scored_data_list`) is split with
`msgspec.Raw` (a scan, no values built) and each element takes the path that fits it; any
error is reported by `wire.decode_group_list`, so its message names the element and field.
"""

from __future__ import annotations

import itertools
import types
import typing
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from atropos import wire
from atropos.wire import Group, ScoredData

__all__ = ["decode_group", "decode_group_list"]

Decoded = tuple[Group, bytes | None]
"""A group and the bytes to store for it (None: encode it with `wire.encode_group`)."""

_UPSTREAM = ScoredData.__struct_fields__
_FIELDS = Group.__struct_fields__
_JSON_SPACE = b" \t\n\r"
_SPACES = (b" ", b"\n", b"\t", b"\r")
_SPACE_TEXT = " \t\n\r"
_REFUSED = (msgspec.DecodeError, RecursionError)  # ValidationError is a DecodeError


def _without_none(kind: Any) -> Any:
    """`kind` with `None` taken out of its union (`Name | None` -> `Name`)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and args:
        return typing.Union[tuple(args)]  # noqa: UP007 - built from a tuple of types
    return kind


def _numbers(kind: Any) -> tuple[Any, int]:
    """`kind` with `wire.Finite` widened to `int | Finite`, and how deep in lists it sits
    (0: no float in it)."""
    if kind is wire.Finite:
        return int | wire.Finite, 1
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        inner, depth = _numbers(args[0])
        return list[inner], depth + 1 if depth else 0  # type: ignore[valid-type]
    if origin in (typing.Union, types.UnionType):
        mapped = [_numbers(a) for a in args]
        depth = max(d for _, d in mapped)
        return typing.Union[tuple(k for k, _ in mapped)], depth  # noqa: UP007
    return kind, 0


def _exact_type() -> Any:
    """A struct with Group's fields that decodes only groups stored as they came (above)."""
    hints = typing.get_type_hints(Group, include_extras=True)
    spec: list[tuple[str, Any, Any]] = []
    for field in msgspec.structs.fields(Group):
        kind, depth = _numbers(hints[field.name])
        if depth:
            _FLOATS.append((_FIELDS.index(field.name), depth - 2))
        if field.name in wire.FREE_FORM:
            spec.append((field.name, None | UnsetType, UNSET))
        elif field.required:
            spec.append((field.name, kind, msgspec.NODEFAULT))
        elif field.name in _UPSTREAM:
            spec.append((field.name, kind | UnsetType, UNSET))
        else:  # an extension key: absent or set
            spec.append((field.name, _without_none(kind) | UnsetType, UNSET))
    return msgspec.defstruct("ExactGroup", spec, forbid_unknown_fields=True)


_FLOATS: list[tuple[int, int]] = []  # (field index, list levels above the rows of numbers)
_Exact = _exact_type()
_exact = msgspec.json.Decoder(_Exact)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def _fast(raw: bytes) -> Decoded | None:
    """The group and its stored bytes, or None when the fast path does not apply."""
    if b"\\" in raw:
        return None
    try:
        exact = _exact.decode(raw)
    except _REFUSED:  # the wire's decoder says what is wrong
        return None
    values = msgspec.structs.astuple(exact)
    for index, levels in _FLOATS:
        if _has_int(values[index], levels):
            return None
    missing = [f for f, v in zip(_FIELDS, values, strict=True) if v is UNSET and f in _UPSTREAM]
    args: list[Any] = [None if v is UNSET else v for v in values]
    group = Group(*args)
    stored = raw
    if any(space in raw for space in _SPACES):  # `json.dumps` writes ", " and ": "
        if any(type(v) is str and any(c in v for c in _SPACE_TEXT) for v in values):
            return None  # a space inside a string: only re-encoding knows which to keep
        stored = raw.translate(None, _JSON_SPACE)  # keys and names hold none: all structural
    if missing:  # an object with at least `tokens`: append before its closing brace
        stored = stored[:-1] + b"".join(b',"%s":null' % f.encode() for f in missing) + b"}"
    return group, stored


def _has_int(value: Any, levels: int) -> bool:
    """Whether a list of numbers (nested `levels` deeper) holds an int."""
    if value is None or value is UNSET:
        return False
    for _ in range(levels):
        value = itertools.chain.from_iterable(value)
    return int in set(map(type, value))


def decode_group(raw: bytes, msgpack: bool = False) -> Decoded:
    """One group (`/scored_data`): ProtocolError naming the field on any type error."""
    if not msgpack:
        found = _fast(raw)
        if found is not None:
            return found
    return wire.decode_group(raw, msgpack), None


def decode_group_list(raw: bytes, msgpack: bool = False) -> list[Decoded]:
    """A list of groups (`/scored_data_list`), each with its stored bytes or None."""
    if msgpack:
        return [(g, None) for g in wire.decode_group_list(raw, True)]
    try:
        parts = _raw_list.decode(raw)
    except _REFUSED:
        parts = None
    if parts is None:
        return [(g, None) for g in wire.decode_group_list(raw)]  # raises, naming the place
    out: list[Decoded] = []
    for part in parts:
        element = bytes(part)
        found = _fast(element)
        if found is None:
            try:
                found = (wire.decode_group(element), None)
            except wire.ProtocolError:
                wire.decode_group_list(raw)  # the same error, with the element's index
                raise
        out.append(found)
    return out
