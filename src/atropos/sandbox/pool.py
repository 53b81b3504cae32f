"""`SandboxPool`: `size` sandboxes kept started, one handed out in about a millisecond.

A handed-out sandbox is never reused: `async with pool.sandbox() as box` closes it at the end
(whatever the exit: return, exception, cancellation) and the pool starts a fresh one in its
place. At most `max_starting` start at once and at most `max_live` exist (warm and handed out
together); a start past `start_timeout` is a `SandboxError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from typing_extensions import Self

from atropos.sandbox.providers import open_sandbox
from atropos.sandbox.spec import ClosesOnExit, Sandbox, SandboxError, SandboxSpec


class SandboxPool(ClosesOnExit):
    def __init__(
        self,
        spec: SandboxSpec,
        provider: str = "bubblewrap",
        size: int = 4,
        max_starting: int = 4,
        max_live: int = 64,
        start_timeout: float = 30.0,
    ) -> None:
        if not 0 <= size <= max_live or max_starting < 1:
            raise ValueError("need 0 <= size <= max_live and max_starting >= 1")
        self.spec, self.provider, self.size = spec, provider, size
        self.start_timeout, self.max_live = start_timeout, max_live
        self.starting = asyncio.Semaphore(max_starting)
        self.live = 0  # warm, starting and handed out
        self.changed = asyncio.Event()  # a warm one arrived or a live slot came free
        self.warm: asyncio.Queue[Sandbox] = asyncio.Queue()
        self.handed_out: set[Sandbox] = set()
        self.fills: set[asyncio.Task[None]] = set()
        self.closed = False
        self.started_count = self.failed_count = 0
        self.peak_starting = self._starting_now = 0

    async def start(self) -> SandboxPool:
        for _ in range(self.size):
            self._fill()
        return self

    def _notify(self) -> None:
        self.changed.set()  # wakes every waiter now; later waits wait again
        self.changed.clear()

    def _fill(self) -> None:
        """Start one more warm sandbox if the pool is short of `size` and a slot is free."""
        if self.closed or self.warm.qsize() + len(self.fills) >= self.size:
            return
        if self.live >= self.max_live:
            return  # refilled when a slot comes free
        self.live += 1
        task = asyncio.ensure_future(self._warm_one())
        self.fills.add(task)
        task.add_done_callback(self.fills.discard)

    async def _warm_one(self) -> None:
        try:
            box = await self._start()
        except SandboxError:
            self._free()
            return  # counted in failed_count; the next handout's fill tries again
        except BaseException:
            self._free()
            raise
        if self.closed:
            await box.close()
            self._free()
            return
        self.warm.put_nowait(box)
        self._notify()

    def _free(self) -> None:
        self.live -= 1
        self._notify()

    async def _start(self) -> Sandbox:
        async with self.starting:
            self._starting_now += 1
            self.peak_starting = max(self.peak_starting, self._starting_now)
            try:
                box = await open_sandbox(self.spec, self.provider, self.start_timeout)
            except SandboxError:
                self.failed_count += 1
                raise
            finally:
                self._starting_now -= 1
            self.started_count += 1
            return box

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        """A started sandbox for one rollout, closed (and replaced) when the block ends."""
        if self.closed:
            raise SandboxError("closed", "the pool is closed")
        box = await self._take()
        self.handed_out.add(box)
        try:
            yield box
        finally:
            self.handed_out.discard(box)
            try:
                await asyncio.shield(box.close())
            finally:
                self._free()
                self._fill()

    async def _take(self) -> Sandbox:
        """A warm sandbox, or one started here when a live slot is free; else wait until
        one of them is."""
        while True:
            if self.closed:
                raise SandboxError("closed", "the pool is closed")
            if not self.warm.empty():
                box = self.warm.get_nowait()
                self._fill()
                return box
            if self.live < self.max_live:
                self.live += 1
                try:
                    return await self._start()
                except BaseException:
                    self._free()
                    raise
            await self.changed.wait()

    async def close(self) -> None:
        """Stop filling and close every sandbox the pool holds or handed out (idempotent)."""
        self.closed = True
        self._notify()
        for task in list(self.fills):
            task.cancel()
        await asyncio.gather(*self.fills, return_exceptions=True)
        boxes = list(self.handed_out)
        while not self.warm.empty():
            boxes.append(self.warm.get_nowait())
        await asyncio.gather(*(box.close() for box in boxes), return_exceptions=True)

    async def __aenter__(self) -> Self:
        """Entering starts the pool (leaving closes it, `ClosesOnExit`)."""
        await self.start()
        return self
