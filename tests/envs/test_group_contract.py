"""`ScoredDataGroup` (what an environment builds) is `atropos.wire.Group` (what travels).

The env-side type is a `TypedDict` (upstream's name and shape, so an upstream env ports by
changing its imports); the one definition of a group is `wire.Group`. These tests hold the two
together: the same field names, the same optionality (a field is nullable on one side exactly
when it is on the other), and the same types once wire's bounds (`Finite`, `EnvId`, `Name`, ...)
are read as the plain types they bound. `ScoredDataItem`, one sequence of a group, names only
group fields, each one level of nesting less.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import msgspec
import pytest

from atropos import wire
from atropos.envs import types as env_types
from atropos.envs.runner.groups import prepare


def _plain(kind: Any) -> str:
    """A type as text, with bounds dropped and both spellings of a chat message made one."""
    if kind is env_types.Message or kind is wire.Message:  # `is`: dict[str, Any] is not one
        return "message"
    if get_origin(kind) is Annotated:
        return _plain(get_args(kind)[0])
    if get_origin(kind) in (Union, types.UnionType):
        return " | ".join(sorted(_plain(k) for k in get_args(kind)))
    if get_origin(kind) in (typing.NotRequired, typing.Required):
        return _plain(get_args(kind)[0])
    origin = get_origin(kind)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_plain(k) for k in get_args(kind))}]"
    if kind is type(None):
        return "None"
    if kind is Any:
        return "Any"
    return str(kind.__name__)


def _wire_fields() -> dict[str, str]:
    hints = get_type_hints(wire.Group, include_extras=True)
    return {f: _plain(hints[f]) for f in wire.Group.__struct_fields__}


def _env_fields(kind: type) -> dict[str, str]:
    hints = get_type_hints(kind, include_extras=True)
    return {f: _plain(h) for f, h in hints.items()}


def test_the_env_group_has_the_wire_group_fields():
    assert set(_env_fields(env_types.ScoredDataGroup)) == set(wire.Group.__struct_fields__)


def test_each_field_has_the_same_type_and_optionality():
    wire_fields, env_fields = _wire_fields(), _env_fields(env_types.ScoredDataGroup)
    differ = {
        name: (env_fields[name], wire_fields[name])
        for name in wire_fields
        if env_fields.get(name) != wire_fields[name]
    }
    assert not differ, f"ScoredDataGroup vs wire.Group, (env, wire) per field: {differ}"


def test_the_fields_wire_requires_are_the_ones_a_sent_group_always_has():
    # the TypedDict is total=False (envs build groups key by key, as upstream); wire requires
    # these three, and `prepare` drops a group that lacks tokens before it is ever sent
    required = {
        f.name for f in msgspec.structs.fields(wire.Group) if f.required
    }  # fmt: skip
    assert required == {"tokens", "masks", "scores"}
    drops: Any = __import__("collections").Counter()
    kept = prepare(
        {"masks": [], "scores": []}, group_size=1, max_token_len=0,
        ensure_scores_differ=False, policy_version=None, env_id=None, drops=drops,
    )  # fmt: skip
    assert kept is None and drops == {"wrong_group_size": 1}


_PER_GROUP = {"group_overrides", "token_source", "images"}  # the same value for the group


@pytest.mark.parametrize("name", sorted(env_types.ScoredDataItem.__annotations__))
def test_an_item_field_is_a_group_field_one_level_down(name):
    wire_fields = _wire_fields()
    item = _env_fields(env_types.ScoredDataItem)[name]
    assert name in wire_fields, f"ScoredDataItem.{name} is no field of wire.Group"
    if name in _PER_GROUP:
        assert item == wire_fields[name]
        return
    rows = " | ".join(sorted(f"list[{k}]" if k != "None" else k for k in item.split(" | ")))
    assert wire_fields[name] == (rows if name != "scores" else "list[float]")


def test_what_an_env_builds_decodes_as_the_wire_group():
    group: env_types.ScoredDataGroup = {
        "tokens": [[1, 2, 3]],
        "masks": [[-100, 2, 3]],
        "scores": [1.0],
        "inference_logprobs": [[1.0, -0.5, -0.25]],
        "messages": [[{"role": "user", "content": "hi"}]],
        "group_id": "g1",
        "policy_version": 2,
        "token_source": "server",
    }
    decoded = wire.decode_group_list(wire.encode_plain([group]))[0]
    assert wire.check_group(decoded) == []
    assert {f: getattr(decoded, f) for f in group} == group
