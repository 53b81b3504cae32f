"""The task mix of `reasoning_gym`: which reasoning-gym tasks, with what weights and configs.

`--env.tasks` is either a string, `"leg_counting,basic_arithmetic:2"` (a name, optionally
`:weight`), or, in a `--config` YAML file, a list whose entries are such strings or mappings
`{name, weight, config}`, `config` being the task's own settings (its difficulty parameters,
as the task's config dataclass names them).

>>> [(t.name, t.weight) for t in parse_tasks("leg_counting, basic_arithmetic:2")]
[('leg_counting', 1.0), ('basic_arithmetic', 2.0)]
>>> parse_tasks([{"name": "chain_sum", "config": {"min_terms": 3}}])[0].config
{'min_terms': 3}
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from atropos.envs.config import ConfigError
from atropos.names import did_you_mean

__all__ = ["TaskSpec", "check_known", "parse_tasks", "pick"]


class TaskSpec(BaseModel):
    """One task of the mix: its reasoning-gym name, its sampling weight, its own config."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="the task's name in reasoning-gym")
    weight: float = Field(default=1.0, gt=0, description="relative share of the items")
    config: dict[str, Any] = Field(
        default_factory=dict, description="the task's settings (its config dataclass's fields)"
    )


def _from_text(text: str) -> TaskSpec:
    name, sep, weight = text.strip().partition(":")
    if not sep:
        return TaskSpec(name=name.strip())
    try:
        value = float(weight)
    except ValueError:
        raise ValueError(f"task {text.strip()!r}: the weight after ':' must be a number") from None
    return TaskSpec(name=name.strip(), weight=value)


def parse_tasks(value: Any) -> list[TaskSpec]:
    """The task list from `--env.tasks`: a "name[:weight],..." string, or a list of such
    strings, `TaskSpec`s and `{name, weight, config}` mappings."""
    if isinstance(value, str):
        entries: Iterable[Any] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        entries = value
    else:
        raise ValueError(
            f"tasks must be a 'name[:weight],...' string or a list, got {type(value).__name__}"
        )
    specs = [_from_text(e) if isinstance(e, str) else TaskSpec.model_validate(e) for e in entries]
    if not specs:
        raise ValueError("tasks is empty: name at least one reasoning-gym task")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"tasks names {', '.join(twice)} more than once: list each task once")
    return specs


def check_known(specs: Sequence[TaskSpec], known: Iterable[str]) -> None:
    """Raise ConfigError (a ValueError; the command line's exit 2) naming the first task of
    `specs` not in `known`, with the closest known names."""
    available = sorted(known)
    for spec in specs:
        if spec.name not in available:
            hint = did_you_mean(spec.name, available, repr)
            raise ConfigError(
                f"reasoning-gym has no task {spec.name!r}{hint} (`python -c 'import"
                " reasoning_gym.factory as f; print(sorted(f.DATASETS))'` lists the"
                f" {len(available)} tasks)"
            )


def pick(specs: Sequence[TaskSpec], rng: random.Random) -> TaskSpec:
    """One task, drawn by weight."""
    return rng.choices(list(specs), weights=[s.weight for s in specs])[0]
