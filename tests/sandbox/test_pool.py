"""SandboxPool: warm handout, the caps on starting and live sandboxes, nothing left after."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from tests.sandbox.conftest import leftovers

from atropos.sandbox import SandboxPool, SandboxSpec


async def _until_warm(pool: SandboxPool, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while pool.warm.qsize() < pool.size and time.monotonic() < end:
        await asyncio.sleep(0.005)


def test_a_warm_sandbox_is_handed_out_in_milliseconds(run_root: Path) -> None:
    async def scenario() -> list[float]:
        times = []
        async with SandboxPool(SandboxSpec(), "bubblewrap", size=4) as pool:
            for _ in range(15):
                await _until_warm(pool)
                began = time.perf_counter()
                async with pool.sandbox() as box:
                    times.append(time.perf_counter() - began)
                    assert (await box.exec("echo ok", timeout=10)).stdout == b"ok\n"
        return times

    times = asyncio.run(scenario())
    assert statistics.median(times) < 0.050, times
    assert leftovers(run_root) == []


def test_max_starting_and_max_live_are_honored(run_root: Path) -> None:
    async def scenario() -> tuple[int, int]:
        live_peak = 0
        async with SandboxPool(
            SandboxSpec(), "process", size=0, max_starting=2, max_live=5
        ) as pool:

            async def rollout() -> None:
                nonlocal live_peak
                async with pool.sandbox() as box:
                    live_peak = max(live_peak, len(pool.handed_out))
                    await box.exec("sleep 0.1", timeout=10)

            await asyncio.gather(*(rollout() for _ in range(12)))
            return pool.peak_starting, live_peak

    peak_starting, live_peak = asyncio.run(scenario())
    assert 1 <= peak_starting <= 2 and 1 <= live_peak <= 5
    assert leftovers(run_root) == []


def test_64_concurrent_sandboxes_then_nothing_left(run_root: Path) -> None:
    uids: list[int] = []

    async def scenario() -> list[bytes]:
        async with SandboxPool(
            SandboxSpec(), "bubblewrap", size=8, max_starting=8, max_live=64
        ) as pool:

            async def rollout(i: int) -> bytes:
                async with pool.sandbox() as box:
                    uids.append(box.uid or 0)
                    await box.put("in.txt", str(i).encode())
                    return (await box.exec("sleep 0.2; cat in.txt", timeout=60)).stdout

            return await asyncio.gather(*(rollout(i) for i in range(64)))

    outputs = asyncio.run(scenario())
    assert outputs == [str(i).encode() for i in range(64)]
    assert len(uids) == 64
    assert leftovers(run_root, uids) == []
