"""One task's live state in `reasoning_gym`: its dataset, and its curriculum where it has one.

Items come from a reasoning-gym dataset made with `reasoning_gym.create_dataset(name, seed=,
size=, **config)`; they are generated on demand by index, so nothing is made ahead or
downloaded. With the curriculum on and a task that registers one (`reasoning_gym.factory`'s
`has_curriculum`), the task starts at the curriculum's lowest level: its difficulty fields come
from `curriculum.generate_configuration(defaults)`, the task's own config supplying the others.
When the share of fully right rollouts over the last `window` rollouts at the current level
passes `threshold`, `increment_global_level()` raises every difficulty attribute by one, a new
dataset is made at the new level and the window restarts. reasoning-gym imports inside the
functions: this module is light to import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from atropos.environments.reasoning_gym.tasks import TaskSpec
from atropos.envs.config import ConfigError

__all__ = ["TaskState", "check_settings", "make_dataset"]


def check_settings(name: str, settings: Iterable[str]) -> None:
    """ConfigError (a ValueError: the command line's one line and exit 2) naming the settings
    the reasoning-gym task `name` does not take, and those it does."""
    from reasoning_gym.factory import DATASETS

    fields = [f.name for f in dataclasses.fields(DATASETS[name][1])]
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise ConfigError(
            f"reasoning-gym task {name!r} has no setting {', '.join(map(repr, unknown))};"
            f" its settings: {', '.join(fields)}"
        )


def make_dataset(name: str, settings: dict[str, Any]) -> Any:
    """The reasoning-gym dataset `name` with `settings` (seed, size and the task's fields);
    `check_settings` first."""
    import reasoning_gym

    check_settings(name, settings)
    return reasoning_gym.create_dataset(name, **settings)


@dataclass
class TaskState:
    """A task's dataset at its current level, the datasets of earlier levels (for scoring
    items made there), and the curriculum window."""

    spec: TaskSpec
    seed: int
    size: int
    curriculum: Any = None  # a reasoning-gym BaseCurriculum, or None
    level: int = 0
    window: list[float] = field(default_factory=list)
    datasets: dict[int, Any] = field(default_factory=dict)
    next_index: int = 0

    @classmethod
    def start(cls, spec: TaskSpec, seed: int, size: int, use_curriculum: bool) -> TaskState:
        """The task at its first level (the curriculum's lowest where it is used)."""
        from reasoning_gym.factory import create_curriculum, has_curriculum

        wanted = use_curriculum and has_curriculum(spec.name)
        curriculum = create_curriculum(spec.name) if wanted else None
        state = cls(spec, seed, size, curriculum)
        state.set_level(state.level)
        return state

    @property
    def dataset(self) -> Any:
        """The dataset items are drawn from now."""
        return self.datasets[self.level]

    def settings(self) -> dict[str, Any]:
        """The dataset's settings at the current level."""
        base = {**self.spec.config, "seed": self.seed, "size": self.size}
        if self.curriculum is None:
            return base
        config = self.curriculum.generate_configuration(base)
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}

    def set_level(self, level: int) -> None:
        """Move to curriculum `level` (0 without a curriculum) and make its dataset."""
        if self.curriculum is not None:
            self.curriculum.set_global_level(level)
        self.level, self.window = level, []
        if level not in self.datasets:
            self.datasets[level] = make_dataset(self.spec.name, self.settings())

    def next_item(self) -> dict[str, Any]:
        """The next item of the current level's dataset (its indices in turn, then again)."""
        index = self.next_index % self.size
        self.next_index += 1
        return self._item(self.dataset[index])

    def items_apart(self, seed: int, count: int) -> list[dict[str, Any]]:
        """`count` items at the current level from a dataset of their own made with `seed`
        (e.g. for evaluation), scored like the others."""
        if count == 0:
            return []
        dataset = make_dataset(self.spec.name, {**self.settings(), "seed": seed, "size": count})
        return [self._item(dataset[i]) for i in range(count)]

    def _item(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {
            "task": self.spec.name,
            "level": self.level,
            "question": entry["question"],
            "answer": entry["answer"],
            "metadata": entry["metadata"],
        }

    def score(self, answer: str | None, item: dict[str, Any]) -> float:
        """The task's own verdict on `answer` for `item` (by the dataset that made it)."""
        entry = {k: item[k] for k in ("question", "answer", "metadata")}
        return float(self.datasets[item["level"]].score_answer(answer, entry))

    def record(self, level: int, accuracies: list[float], window: int, threshold: float) -> bool:
        """Count a group's rollouts (1.0 right, else 0.0) of an item made at `level` (those of
        another level are ignored); raise the level when the window of the last `window` is
        full and its accuracy passes `threshold`. True when it rose."""
        if self.curriculum is None or level != self.level:
            return False
        self.window = (self.window + accuracies)[-window:]
        if len(self.window) < window or sum(self.window) / window <= threshold:
            return False
        if not self.curriculum.increment_global_level():
            return False  # at the top already
        self.set_level(self.level + 1)
        return True
