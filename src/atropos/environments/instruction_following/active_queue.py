"""The active-queue curriculum of `instruction_following` (upstream's, with checkpoints).

Items are served from the front of an active queue. After its group is scored an item is
*solved* (retired) when its mean score is above the training ceiling (0.75) or at least 0.9,
or, with `single`, when any completion is right; otherwise it goes to the back of the queue.
When the queue runs dry it is refilled with the solved items and the attempt counts restart.
An item is identified by a hash of its prompt, check and arguments, so a checkpoint (`state`)
survives a restart; items in flight when it was taken go back into the queue on `restore`.

>>> q = ActiveQueue([{"id": "a"}, {"id": "b"}])
>>> first = q.next()
>>> q.record(first, [1.0, 1.0], max_average=0.75), q.metrics()["curriculum/solved_items"]
(True, 1)
>>> q.record(q.next(), [0.0, 1.0], max_average=0.75), [i["id"] for i in q.active]
(False, ['b'])
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["SOLVED_AT", "ActiveQueue", "item_id"]

log = logging.getLogger("atropos.env")
SOLVED_AT = 0.9  # a group mean at or above this retires its item whatever the ceiling


def item_id(item: Mapping[str, Any]) -> str:
    """A stable id of an item from its prompt, check name and arguments."""
    key = json.dumps([item.get("prompt"), item.get("func_name"), item.get("args")], sort_keys=True)
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:16]


class ActiveQueue:
    """Unsolved items in rotation, solved ones set aside, attempts per item."""

    def __init__(self, items: Iterable[dict[str, Any]]) -> None:
        self.by_id = {item["id"]: item for item in items}
        self.active: deque[dict[str, Any]] = deque(self.by_id.values())
        self.solved: list[dict[str, Any]] = []
        self.attempts: dict[str, int] = {}
        self._placed = set(self.by_id)  # ids in `active` or `solved` (not in flight)
        self._rotation = 0

    @property
    def total(self) -> int:
        """How many distinct items there are."""
        return len(self.by_id)

    def next(self) -> dict[str, Any]:
        """The next item; when every item is in flight, one of them again."""
        if not self.active and self.solved:
            self.active, self.solved, self.attempts = deque(self.solved), [], {}
        if not self.active:  # more workers than items: serve a duplicate
            self._rotation += 1
            return list(self.by_id.values())[self._rotation % self.total]
        item = self.active.popleft()
        self._placed.discard(item["id"])
        self.attempts[item["id"]] = self.attempts.get(item["id"], 0) + 1
        return item

    def record(
        self, item: dict[str, Any], scores: list[float], max_average: float, single: bool = False
    ) -> bool:
        """Retire or requeue `item` after its group; returns whether it is solved."""
        mean = sum(scores) / len(scores) if scores else 0.0
        solved = (single and any(s >= 1.0 for s in scores)) or mean > max_average
        solved = solved or mean >= SOLVED_AT
        if item["id"] not in self._placed:  # a duplicate served while in flight is placed once
            (self.solved.append if solved else self.active.append)(item)
            self._placed.add(item["id"])
        return solved

    def put_back(self, item: dict[str, Any]) -> None:
        """Return an item whose rollout failed to the front of the queue."""
        if item["id"] not in self._placed:
            self.active.appendleft(item)
            self._placed.add(item["id"])

    def metrics(self) -> dict[str, float]:
        """`curriculum/*`: active, solved and total items, share solved, attempts of active ones."""
        active, solved = len(self.active), len(self.solved)
        out: dict[str, float] = {
            "curriculum/active_items": active,
            "curriculum/solved_items": solved,
        }
        if active + solved:
            out["curriculum/total_items"] = active + solved
            out["curriculum/percent_solved"] = solved / (active + solved)
        tried = [self.attempts[i["id"]] for i in self.active if i["id"] in self.attempts]
        if tried:
            out["curriculum/avg_attempts_active"] = sum(tried) / len(tried)
        return out

    def state(self) -> dict[str, Any]:
        """The queue as ids, for a checkpoint."""
        return {
            "active": [i["id"] for i in self.active],
            "solved": [i["id"] for i in self.solved],
            "attempts": dict(self.attempts),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Rebuild the queue from `state()`; items it does not mention go to the back."""
        known = [i for i in state.get("active", []) if i in self.by_id]
        solved = [i for i in state.get("solved", []) if i in self.by_id and i not in known]
        unknown = len(state.get("active", [])) + len(state.get("solved", [])) - len(known)
        unknown -= len(solved)
        if unknown:
            log.warning("curriculum checkpoint: %d items are not in the dataset; ignored", unknown)
        rest = [i for i in self.by_id if i not in set(known) | set(solved)]
        self.active = deque(self.by_id[i] for i in [*known, *rest])
        self.solved = [self.by_id[i] for i in solved]
        self.attempts = {k: int(v) for k, v in state.get("attempts", {}).items() if k in self.by_id}
        self._placed = set(self.by_id)
