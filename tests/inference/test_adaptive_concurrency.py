"""Adaptive concurrency over real loopback servers: the in-flight cap grows while the server keeps
up, up to the configured maximum and never past it; shrinks when the server queues (its
`/metrics`: waiting requests, a full KV cache), down to the floor and never under it; and follows
latency on a server without metrics (a fake that serves 4 requests at a time and queues the
rest)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from atropos.inference.concurrency import AdaptiveLimit
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.testing import FakeInferenceServer

MAX, FLOOR = 16, 2


class Gauges:
    """An ASGI wrapper: answers `GET /metrics` with vLLM's gauges (as set by the test, or 404
    when `serve` is off) and counts generation requests in flight at the server."""

    def __init__(self, app: Any, serve: bool = True) -> None:
        self.app = app
        self.serve = serve
        self.waiting = 0.0
        self.kv = 0.1
        self.in_flight = self.peak = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            body = (
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{engine="0"}} {self.waiting}\n'
                f'vllm:kv_cache_usage_perc{{engine="0"}} {self.kv}\n'
            ).encode()
            status = 200 if self.serve else 404
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": body if self.serve else b""})
            return
        generation = scope["type"] == "http" and scope["method"] == "POST"
        if generation:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            await self.app(scope, receive, send)
        finally:
            if generation:
                self.in_flight -= 1


def settings(**fields: Any) -> ServerManagerConfig:
    base = {
        "adaptive_concurrency": True,
        "adaptive_floor": FLOOR,
        "adaptive_interval": 0.05,
        "health_check_interval": 0.05,
    }
    return ServerManagerConfig(**{**base, **fields})


@contextlib.asynccontextmanager
async def pumped(m: ServerManager, workers: int) -> AsyncIterator[None]:
    """`workers` callers each sending chat calls back to back until the block ends."""

    async def work() -> None:
        while True:
            await m.chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2)

    tasks = [asyncio.create_task(work()) for _ in range(workers)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached within the deadline"
        await asyncio.sleep(0.01)


def test_the_cap_grows_to_the_max_and_shrinks_to_the_floor_on_the_queue_gauges() -> None:
    server = FakeInferenceServer(latency=0.02)
    gauges = Gauges(server.app)
    server.app = gauges
    with server:
        config = APIServerConfig(
            base_url=server.base_url, server_type="vllm", num_max_requests_at_once=MAX
        )

        async def main() -> None:
            async with ServerManager([config], settings()) as m:
                limit = m._pool.slots[0].limit
                assert isinstance(limit, AdaptiveLimit) and limit.value == FLOOR
                seen: list[int] = []
                async with pumped(m, 64):
                    sampler = asyncio.create_task(sample(limit, seen))
                    await until(lambda: limit.value == MAX)  # grows while it keeps up
                    await asyncio.sleep(0.5)  # and stays at the max, never past it
                    assert max(seen) == MAX and limit.signal == "queue"
                    assert seen == sorted(seen)  # never shrank: nothing queued
                    metrics = m.metrics()
                    assert metrics["server/server_0_concurrency_limit"] == MAX
                    assert metrics["server/server_0_concurrency_max"] == MAX
                    assert metrics["server/server_0_queue_waiting"] == 0
                    assert metrics["server/server_0_capacity"] == MAX

                    gauges.waiting = 3  # the server queues: the cap shrinks, to the floor
                    await until(lambda: limit.value == FLOOR)
                    seen.clear()
                    await asyncio.sleep(0.5)
                    assert set(seen) == {FLOOR}  # never under it
                    await until(lambda: gauges.in_flight <= FLOOR)

                    gauges.waiting = 0  # nothing waits: it grows again
                    await until(lambda: limit.value >= 8)
                    gauges.kv = 0.97  # a full KV cache counts as queueing
                    await until(lambda: limit.value == FLOOR)
                    gauges.kv = 0.5
                    await until(lambda: limit.value == MAX)  # and grows back to the max
                    sampler.cancel()
                assert limit.shrunk >= 2 and limit.grown >= 4
            assert gauges.peak <= MAX  # the server never saw more than the configured max

        asyncio.run(main())


async def sample(limit: AdaptiveLimit, seen: list[int]) -> None:
    while True:
        seen.append(limit.value)
        await asyncio.sleep(0.01)


def test_without_metrics_the_cap_follows_latency_of_a_queueing_server() -> None:
    """A server that serves 4 requests at a time (0.05 s each) and queues the rest: latency
    doubles past 8 in flight. The cap grows off the floor and settles far under the max."""
    queue: dict[str, asyncio.Semaphore] = {}

    async def serve_four(prompt: str) -> str:
        slots = queue.setdefault("slots", asyncio.Semaphore(4))  # the server's own loop
        async with slots:
            await asyncio.sleep(0.05)
        return "ok"

    server = FakeInferenceServer(responder=serve_four)
    gauges = Gauges(server.app, serve=False)  # /metrics is a 404: latency from then on
    server.app = gauges
    with server:
        config = APIServerConfig(
            base_url=server.base_url, server_type="vllm", num_max_requests_at_once=256
        )

        async def main() -> list[int]:
            async with ServerManager([config], settings(adaptive_interval=0.2)) as m:
                limit = m._pool.slots[0].limit
                assert limit is not None
                seen: list[int] = []
                async with pumped(m, 128):
                    await until(lambda: limit.signal == "latency")
                    await asyncio.sleep(4.0)
                    sampler = asyncio.create_task(sample(limit, seen))
                    await asyncio.sleep(4.0)
                    sampler.cancel()
                assert limit.grown >= 2 and limit.shrunk >= 1
                return seen

        seen = asyncio.run(main())
    assert max(seen) >= 4  # grew off the floor of 2
    assert sum(seen) / len(seen) <= 64  # a quarter of the max: held near what the server serves
