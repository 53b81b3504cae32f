"""Providers by name: `open_sandbox(spec, provider)` starts one and hands it back started;
`sweep()` removes what dead owners left, under the run root and on the Docker engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from atropos.sandbox import _host
from atropos.sandbox._engine import EngineError, engine_socket
from atropos.sandbox.bubblewrap import BubblewrapSandbox
from atropos.sandbox.docker import DockerSandbox, sweep_docker
from atropos.sandbox.process import ProcessSandbox
from atropos.sandbox.spec import Sandbox, SandboxError, SandboxSpec


class Startable(Protocol):
    async def start(self, timeout: float) -> Sandbox: ...


PROVIDERS: dict[str, Callable[[SandboxSpec], Startable]] = {
    "bubblewrap": BubblewrapSandbox,
    "process": ProcessSandbox,
    "docker": DockerSandbox,
}


async def open_sandbox(
    spec: SandboxSpec, provider: str = "bubblewrap", start_timeout: float = 30.0
) -> Sandbox:
    """A started sandbox of `provider`; raises `SandboxError` (reason start_failed,
    start_timeout, image_missing, unsupported or unavailable) when it cannot be had."""
    if provider not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS))
        raise SandboxError(
            "unavailable", f"provider {provider!r}: no such provider; available: {known}"
        )
    return await PROVIDERS[provider](spec).start(start_timeout)


def sweep(root: Path | None = None) -> int:
    """Remove what sandboxes of dead owners left: their processes, folders and uids under the
    run root (`root`, default `$ATROPOS_SANDBOX_ROOT`), and their containers on the Docker
    engine of `DOCKER_HOST` when its socket exists. Returns how many sandboxes that was. The
    first sandbox of each kind a process starts runs its part; call it any time."""
    removed = _host.sweep(root)
    try:
        socket = engine_socket()
    except EngineError:
        return removed
    if os.path.exists(socket):
        try:
            removed += _run_aside(sweep_docker)
        except EngineError:
            pass  # an engine we may not use (permissions) or that does not answer
    return removed


def _run_aside(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """`asyncio.run(main())` in a thread of its own: callable inside a running event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, main()).result()
