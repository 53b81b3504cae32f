"""`Deadlines`: `worker_timeout` for every rollout in flight, with one timer for them all.

`asyncio.timeout` around each rollout costs a timer (a handle pushed on the loop's heap and
cancelled again) and three `get_running_loop` calls, each a `getpid` system call on Python
3.11: at 256 workers about 3% of the env's CPU. Here a rollout's limit is an entry in a dict,
and one task (`watch`) looks every `tick` seconds (a quarter of the limit, at most 1 s) for
entries past due and cancels their tasks; `within` turns that cancellation into
`TimeoutError` (the serve runner does the same in its own frame with `start`, `expired` and
`stop`: one coroutine level less on every resume of a rollout). So a rollout ends between
its limit and its limit plus `tick` (a limit of 600 s: 600 to 601 s), where `asyncio.timeout`
was exact; nothing else changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Deadlines:
    """Time limits of `seconds` (None: no limit) on awaits of many tasks, one timer for all."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.tick = 1.0 if seconds is None else max(0.005, min(1.0, seconds / 4))
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()

    async def within(self, task: asyncio.Task[object], started: float, aw: Awaitable[T]) -> T:
        """Await `aw` in `task` (the running task); TimeoutError once `seconds` have passed
        since `started` (`time.monotonic()`)."""
        self.start(task, started)
        try:
            return await aw
        except asyncio.CancelledError:
            if self.expired(task):
                raise TimeoutError from None
            raise
        finally:
            self.stop(task)

    def start(self, task: asyncio.Task[object], started: float) -> None:
        """`task`'s limit runs from `started` (`time.monotonic()`) until `stop`. For a runner
        that awaits in its own frame (one coroutine level less per resume than `within`): a
        `CancelledError` there is a timeout when `expired(task)` says so."""
        if self.seconds is not None:
            self._due[task] = started + self.seconds

    def stop(self, task: asyncio.Task[object]) -> None:
        """`task`'s limit no longer runs."""
        if self._due:
            self._due.pop(task, None)

    def expired(self, task: asyncio.Task[object]) -> bool:
        """Whether the `CancelledError` `task` just caught is its limit passing (then it is
        uncancelled, to go on as a `TimeoutError`), not another cancel (a shutdown's, which
        must stay a cancel)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        return uncancel is None or uncancel() == 0

    async def watch(self) -> None:
        """Cancel the tasks past their limit, every `tick` seconds, until cancelled."""
        if self.seconds is None:
            return
        due = self._due
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            for task in [t for t, at in due.items() if at <= now]:
                del due[task]
                self._expired.add(task)
                task.cancel()
