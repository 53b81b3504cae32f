"""A real `atropos api serve` process for transport tests (gzip bombs, heads, store files)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

import atropos
from atropos.demo import Service, wait_until_up
from atropos.testing import free_port

SRC = str(Path(atropos.__file__).resolve().parents[1])  # this checkout's sources


@dataclass
class LiveApi:
    url: str
    service: Service
    store: Path

    @property
    def pid(self) -> int:
        assert self.service.proc is not None
        return self.service.proc.pid


@contextmanager
def live_api(tmp_path: Path, *flags: str) -> Iterator[LiveApi]:
    """Serve the API on a free loopback port with a SQLite store under `tmp_path/run`."""
    port = free_port()
    store = tmp_path / "run" / "api.db"
    args = ["api", "serve", "--port", str(port), "--store", f"sqlite:{store}", *flags]
    service = Service.atropos("api", args, tmp_path / "api.log")
    service.start(extra_env={"PYTHONPATH": SRC})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/health", deadline=30, service=service)
        yield LiveApi(url, service, store)
    finally:
        service.stop(grace=10)


async def poll_health(url: str, done: asyncio.Event, every: float = 0.01) -> list[float]:
    """Latencies (seconds) of `/health` requests on one connection until `done` is set."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        await client.get("/health")  # connect first: measure answers, not the handshake
        while not done.is_set():
            start = time.perf_counter()
            resp = await client.get("/health")
            latencies.append(time.perf_counter() - start)
            assert resp.status_code == 200
            await asyncio.sleep(every)
    return latencies
