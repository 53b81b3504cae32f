"""`run_owned(main)`: run an owner's async main so that SIGTERM (and SIGINT) cancel it, and
every sandbox it holds in `async with` (or a pool) is closed before the process exits.

Python's default SIGTERM ends the process at once: no `finally`, no `close()`. Containers
and the process provider's trees would then live until the next `sweep()`. With this, SIGTERM
cancels the main task; the cancellation unwinds the `async with` blocks, each `close()` runs
to its end (shielded), and `run_owned` returns 143 (130 after SIGINT). A second signal does
not stop the cleanup.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

STATUS = {signal.SIGTERM: 143, signal.SIGINT: 130}


def run_owned(main: Callable[[], Awaitable[Any]]) -> int:
    """Run `main()` to its end (status 0) or until SIGTERM/SIGINT cancels it (143/130)."""
    return asyncio.run(_owned(main))


async def _owned(main: Callable[[], Awaitable[Any]]) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main())
    received: list[int] = []

    def cancel(signum: int) -> None:
        if not received:
            received.append(signum)
            task.cancel()

    for signum in STATUS:
        loop.add_signal_handler(signum, cancel, signum)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for signum in STATUS:
            loop.remove_signal_handler(signum)
    return STATUS[signal.Signals(received[0])] if received else 0
