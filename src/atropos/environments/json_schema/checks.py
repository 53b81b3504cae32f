"""Reading and judging `json_schema`'s answers: the JSON in `<json_output>` tags, validated by
the item's pydantic model in JSON mode, the share of its top-level fields that are valid (for
partial credit), and, for a fix, the share of the untouched values it kept.

>>> from atropos.environments.json_schema.schemas import SCHEMAS
>>> card = SCHEMAS["ContactCard"]
>>> judge(card, '{"name": "Ada", "email": "ada@example.org"}')
Verdict(parsed=True, valid=True, field_share=1.0)
>>> judge(card, '{"name": "", "email": "ada@example.org", "x": 1}')  # 3 of 4 fields, 1 extra
Verdict(parsed=True, valid=False, field_share=0.6)
>>> json_text("<json_output>\\n```json\\n{}\\n```\\n</json_output>"), json_text("{}")
('{}', None)
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from atropos.environments.json_schema.corrupt import Path, leaves, related
from atropos.rewards.text import tagged

__all__ = ["Verdict", "judge", "json_text", "kept_share"]

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.DOTALL)


def json_text(answer: str) -> str | None:
    """The text of the answer's one `<json_output>` block (a code fence inside it removed), or
    None when there is not exactly one."""
    if answer.count("<json_output>") != 1:
        return None
    found = tagged(answer, "json_output")
    if len(found) != 1:
        return None
    text = found[0].strip()
    fenced = _FENCE.fullmatch(text)
    return (fenced.group(1) if fenced else text).strip()


@dataclass(frozen=True)
class Verdict:
    """What validation says of one answer: whether it is JSON at all, whether the model
    accepts it, and the share of the model's top-level fields that hold no error (a key the
    model does not declare counts as one more field, in error)."""

    parsed: bool
    valid: bool
    field_share: float


def judge(model: type[BaseModel], text: str) -> Verdict:
    """Validate `text` as `model` (JSON mode: dates as ISO strings, enums by value)."""
    try:
        data = json.loads(text)
    except ValueError:
        return Verdict(False, False, 0.0)
    try:
        model.model_validate_json(text)
    except ValidationError as e:
        if not isinstance(data, dict):
            return Verdict(True, False, 0.0)
        fields = set(model.model_fields)
        wrong = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
        extra = wrong - fields
        return Verdict(True, False, len(fields - wrong) / (len(fields) + len(extra)))
    return Verdict(True, True, 1.0)


def kept_share(original: Any, broken: Sequence[Path], answer: Any) -> float:
    """The share of `original`'s values outside the `broken` paths that `answer` holds at the
    same place, unchanged (1.0 when every value was broken)."""
    untouched = [
        (path, value)
        for path, value in leaves(original)
        if not any(related(path, b) for b in broken)
    ]
    if not untouched:
        return 1.0
    return sum(_at(answer, path) == (True, value) for path, value in untouched) / len(untouched)


def _at(data: Any, path: Path) -> tuple[bool, Any]:
    """(True, the value at `path` in `data`), or (False, None) when there is none."""
    for key in path:
        if isinstance(data, dict) and isinstance(key, str) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        else:
            return False, None
    return True, data
