"""How a run is asked to stop: SIGINT and SIGTERM, in every state, with one exit-code rule.

`Stopper` turns the signals into an `asyncio.Event` that every wait of a runner watches (setup,
registration, the wait for a healthy inference server, rollouts), so a signal stops `serve`,
`process` and `evaluate` promptly whatever they are doing. What happens next is the runner's:
it flushes what it holds (JSONL, spool), prints its summary and exits with `exit_code`:

* 0: the run ended on its own (target reached, trainer finished);
* 130 after SIGINT (Ctrl-C), 143 after SIGTERM (128 + the signal's number, the shell's rule),
  so a script can tell an interrupted run from a finished one; the data written is complete;
* 1: a failure (a fatal error, a deadline passed), said in one message.

A second signal means "now": the runner stops waiting for in-flight work (`urgent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

log = logging.getLogger("atropos.env")
T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """A wait ended because the run was asked to stop."""


class Stopper:
    """The run's stop request, set by a signal (`install`) or by code (`event.set()`)."""

    def __init__(self, event: asyncio.Event | None = None) -> None:
        self.event = event or asyncio.Event()
        self.urgent = asyncio.Event()  # a second signal: stop waiting for in-flight work
        self.signum: int | None = None

    @property
    def exit_code(self) -> int:
        """128 + the signal's number after a signal (130 SIGINT, 143 SIGTERM), else 0."""
        return 128 + self.signum if self.signum is not None else 0

    @property
    def name(self) -> str:
        """The signal's name ("SIGINT"), or "" when none came."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def on_signal(self, signum: int, doing: str) -> None:
        """Record `signum` and set the event; a second signal sets `urgent` too."""
        name = signal.Signals(signum).name
        if self.signum is not None:
            log.warning("received %s again: stopping now", name)
            self.urgent.set()
        else:
            self.signum = signum
            log.warning("received %s: %s", name, doing)
        self.event.set()

    @contextlib.contextmanager
    def install(self, doing: str) -> Iterator[Stopper]:
        """SIGINT and SIGTERM call `on_signal(signum, doing)` inside the block (the running
        loop's handlers; nothing where the loop cannot take them, e.g. outside the main
        thread)."""
        loop = asyncio.get_running_loop()
        installed = []
        for sig in SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.on_signal, sig, doing)
                installed.append(sig)
        try:
            yield self
        finally:
            for sig in installed:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)

    async def race(self, aw: Awaitable[T]) -> T:
        """Await `aw`, unless the stop request comes first: then cancel it, raise `Stopped`."""
        if self.event.is_set():
            if asyncio.iscoroutine(aw):
                aw.close()
            raise Stopped
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task.cancelled():
            raise Stopped
        return task.result()

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less when the stop request comes (then raise `Stopped`)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)
        if self.event.is_set():
            raise Stopped
