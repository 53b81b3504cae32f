"""Stopping on SIGTERM or SIGINT: finish the step in progress, checkpoint, exit; end a wait at
once.

`stop_on_signals()` gives `stopping()` (true after a signal), `restore()` (the previous
handlers back) and `waiting(what)`: a context manager inside which a signal interrupts the wait
at once (`Interrupted`, raised from the handler) instead of after it (a wait for the API or a
batch may last minutes, and a step in progress must not be cut). Under torchrun each rank has its
own handlers; the trainer's loop tells every rank when any of them got a signal (`Ranks.any`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("atropos.trainer")

Waiting = Callable[[str], contextlib.AbstractContextManager[None]]


class Interrupted(Exception):
    """A signal came while the trainer waited (for the API, the server or a batch)."""


def stop_on_signals() -> tuple[Callable[[], bool], Callable[[], None], Waiting]:
    """`(stopping, restore, waiting)`, as the module docstring says. Outside the main thread
    (a trainer run from a test's thread) no handler is installed."""
    flag: dict[str, Any] = {"stop": False, "waiting": None}

    def handler(signum: int, frame: Any) -> None:
        flag["stop"] = True
        name = signal.Signals(signum).name
        if flag["waiting"] is not None:
            raise Interrupted(f"received {name} while waiting for {flag['waiting']}")
        log.info("received %s: finishing this step, then stopping", name)

    @contextlib.contextmanager
    def waiting(what: str) -> Iterator[None]:
        if flag["stop"]:
            raise Interrupted(f"stopping: asked to before waiting for {what}")
        flag["waiting"] = what
        try:
            yield
        finally:
            flag["waiting"] = None

    def stopping() -> bool:
        return bool(flag["stop"])

    if threading.current_thread() is not threading.main_thread():
        return stopping, (lambda: None), waiting
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return stopping, restore, waiting
