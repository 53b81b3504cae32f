"""Error introduction for `json_schema`'s fix tasks: an almost-valid JSON object made from a
valid one by a few seeded, typed mistakes.

The mistakes are found from the model's JSON Schema, so any pydantic model works: every value
of the object is a site (nested objects and list elements included), and each kind proposes
the mistakes a site allows:

- `type_error`: a value of another JSON type (a number for a string, a word for a number,
  a string for a list or an object);
- `missing_required`: a required key removed;
- `enum_error`: a value outside an enum or `Literal`;
- `constraint_error`: a bound, length, pattern or list size broken;
- `extra_field`: a key the model does not declare (the shipped models forbid extras).

A mistake is kept only when it alone makes the object invalid, and never on a path above,
below or at one already broken, so each one is a separate error to fix.

>>> from atropos.environments.json_schema.schemas import SCHEMAS
>>> broken = corrupt(SCHEMAS["ContactCard"], {"name": "Ada", "email": "ada@example.org"},
...                  random.Random(0), count=2)
>>> len(broken.mistakes), broken.data != {"name": "Ada", "email": "ada@example.org"}
(2, True)
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = [
    "KINDS",
    "Corrupted",
    "Mistake",
    "Path",
    "corrupt",
    "leaves",
    "related",
    "resolve",
    "schema_sites",
]

Path = tuple[str | int, ...]
KINDS = ("type_error", "missing_required", "enum_error", "constraint_error", "extra_field")
_EXTRA_KEYS = ("comment", "metadata", "legacy_id", "source", "extra")


@dataclass(frozen=True)
class Site:
    """One value of the object, with its (resolved) schema; `required` when its key is one of
    its parent object's required keys."""

    path: Path
    schema: dict[str, Any]
    value: Any
    required: bool


@dataclass(frozen=True)
class Mistake:
    """One introduced error: its kind, where, and the value set there (`delete`: the key
    removed)."""

    kind: str
    path: Path
    value: Any = None
    delete: bool = False


@dataclass(frozen=True)
class Corrupted:
    """The broken object and the mistakes in it."""

    data: Any
    mistakes: list[Mistake]


def resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$ref` followed and, for an optional value, its non-null branch."""
    while True:
        if "$ref" in schema:
            schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in schema:
            schema = next((s for s in schema["anyOf"] if s.get("type") != "null"), {})
        else:
            return schema


def schema_sites(
    value: Any, schema: dict[str, Any], root: dict[str, Any], path: Path = (), required: bool = True
) -> Iterator[Site]:
    """Every value inside `value` (itself first) with its schema, depth first."""
    schema = resolve(schema, root)
    yield Site(path, schema, value, required)
    if isinstance(value, dict):
        properties, needed = schema.get("properties", {}), set(schema.get("required", []))
        for key, inner in value.items():
            if key in properties:
                yield from schema_sites(inner, properties[key], root, (*path, key), key in needed)
    elif isinstance(value, list) and "items" in schema:
        for index, inner in enumerate(value):
            yield from schema_sites(inner, schema["items"], root, (*path, index), True)


def _other_type(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return rng.choice(["sometimes", "maybe"])
    if isinstance(value, (int, float)):
        return rng.choice(["many", "unknown", "n/a"])
    if isinstance(value, str):
        return rng.randint(10, 99999)
    return rng.choice(["none", "see above"])  # a list or an object as a string


def _number_outside(schema: dict[str, Any], rng: random.Random) -> int | float | None:
    step = rng.randint(1, 50) + (0 if schema.get("type") == "integer" else 0.5)
    found = []
    if "maximum" in schema:
        found.append(schema["maximum"] + step)
    if "exclusiveMaximum" in schema:
        found.append(schema["exclusiveMaximum"])
    if "minimum" in schema:
        found.append(schema["minimum"] - step)
    if "exclusiveMinimum" in schema:
        found.append(schema["exclusiveMinimum"])
    return rng.choice(found) if found else None


def _string_outside(schema: dict[str, Any], value: str) -> str | None:
    if schema.get("minLength", 0) > 0:
        return ""
    if "maxLength" in schema:
        longest: int = schema["maxLength"]
        return (value + " ") * (longest // max(1, len(value)) + 2)
    if "pattern" in schema:
        for candidate in (f"{value} !", value.lower().replace("-", " "), "?"):
            if re.search(schema["pattern"], candidate) is None:
                return candidate
    return None


def _list_outside(schema: dict[str, Any], value: list[Any]) -> list[Any] | None:
    if schema.get("minItems", 0) > 0:
        return value[: schema["minItems"] - 1]
    if "maxItems" in schema and value:
        return value + [copy.deepcopy(value[0])] * (schema["maxItems"] + 1 - len(value))
    return None


def _broken_constraint(site: Site, rng: random.Random) -> Any:
    value, schema = site.value, site.schema
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return _number_outside(schema, rng)
    if isinstance(value, str):
        return _string_outside(schema, value)
    if isinstance(value, list):
        return _list_outside(schema, value)
    return None


def _proposals(site: Site, rng: random.Random) -> Iterator[Mistake]:
    """The mistakes `site` allows, one per kind at most."""
    if site.path and site.value is not None:
        yield Mistake("type_error", site.path, _other_type(site.value, rng))
    if site.path and site.required and isinstance(site.path[-1], str):
        yield Mistake("missing_required", site.path, delete=True)
    if "enum" in site.schema:
        yield Mistake("enum_error", site.path, rng.choice(["unknown", "other", "N/A"]))
    broken = _broken_constraint(site, rng)
    if broken is not None:
        yield Mistake("constraint_error", site.path, broken)
    if isinstance(site.value, dict) and site.schema.get("additionalProperties") is False:
        free = [k for k in _EXTRA_KEYS if k not in site.schema.get("properties", {})]
        yield Mistake("extra_field", (*site.path, rng.choice(free)), "unexpected")


def apply(data: Any, mistake: Mistake) -> Any:
    """A copy of `data` with `mistake` made."""
    data = copy.deepcopy(data)
    if not mistake.path:
        return mistake.value
    parent = data
    for key in mistake.path[:-1]:
        parent = parent[key]
    if mistake.delete:
        del parent[mistake.path[-1]]
    else:
        parent[mistake.path[-1]] = mistake.value
    return data


def _invalid(model: type[BaseModel], data: Any) -> bool:
    try:
        model.model_validate_json(json.dumps(data))
    except ValidationError:
        return True
    return False


def related(a: Path, b: Path) -> bool:
    """Whether one path is the other or lies under it."""
    return a[: len(b)] == b or b[: len(a)] == a


def corrupt(
    model: type[BaseModel],
    data: Any,
    rng: random.Random,
    count: int = 1,
    kinds: tuple[str, ...] | list[str] = KINDS,
) -> Corrupted:
    """`data` (valid for `model`) with up to `count` mistakes of `kinds`, each kind drawn
    evenly among those that have a mistake to offer.

    Raises:
        ValueError: no mistake of `kinds` makes `data` invalid.
    """
    root = model.model_json_schema()
    by_kind: dict[str, list[Mistake]] = {kind: [] for kind in kinds}
    for site in schema_sites(data, root, root):
        for mistake in _proposals(site, rng):
            if mistake.kind in by_kind:
                by_kind[mistake.kind].append(mistake)
    made: list[Mistake] = []
    while len(made) < count and any(by_kind.values()):
        pool = by_kind[rng.choice([k for k, found in by_kind.items() if found])]
        mistake = pool.pop(rng.randrange(len(pool)))
        if any(related(mistake.path, m.path) for m in made):
            continue
        if _invalid(model, apply(data, mistake)):
            made.append(mistake)
    if not made:
        raise ValueError(f"no mistake of {', '.join(kinds)} makes this {model.__name__} invalid")
    for mistake in made:
        data = apply(data, mistake)
    return Corrupted(data, made)


def leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every scalar (and empty list or object) inside `value`, with its path."""
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from leaves(inner, (*path, key))
    elif isinstance(value, list) and value:
        for index, inner in enumerate(value):
            yield from leaves(inner, (*path, index))
    else:
        yield path, value
