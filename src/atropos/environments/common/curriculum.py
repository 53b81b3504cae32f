"""A level curriculum: a difficulty level moved by the rolling success rate at that level.

`letter_counting` records one value per group (its mean score), `infinimath` one per rollout
(1.0 right, 0.0 wrong). The window keeps the last `window` values recorded at the current
level; once it holds `min_samples` of them (half the window, at least 10), a mean above
`raise_above` moves up a level and one below `lower_below` moves down, within
`lowest`..`highest`, and the window restarts. A value from an item made at another level
(before a move) is ignored. `level` and `scores` are the whole state a checkpoint keeps.

>>> c = Curriculum(level=3, window=20)
>>> [c.record(0.9, level=3) for _ in range(10)][-1], c.level, c.scores
(1, 4, [])
>>> c.record(0.0, level=3), c.level  # made before the move: not counted
(0, 4)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Curriculum"]


@dataclass
class Curriculum:
    """The level and the window of recent values at it."""

    level: int = 3
    window: int = 150
    raise_above: float = 0.8
    lower_below: float = 0.2
    lowest: int = 1
    highest: int = 10
    scores: list[float] = field(default_factory=list)

    @property
    def min_samples(self) -> int:
        """Values needed at a level before it may change: half the window, at least 10."""
        return max(10, self.window // 2)

    @property
    def success_rate(self) -> float | None:
        """The mean of the window (None when empty)."""
        return sum(self.scores) / len(self.scores) if self.scores else None

    def record(self, value: float, level: int) -> int:
        """Count one value (a group's mean score, a rollout's 1.0 or 0.0) of an item made at
        `level`; returns the level change (-1, 0 or +1)."""
        if level != self.level:
            return 0
        self.scores.append(value)
        del self.scores[: -self.window]
        rate = self.success_rate
        if rate is None or len(self.scores) < self.min_samples:
            return 0
        step = 0
        if rate > self.raise_above and self.level < self.highest:
            step = 1
        elif rate < self.lower_below and self.level > self.lowest:
            step = -1
        if step:
            self.level += step
            self.scores = []
        return step
