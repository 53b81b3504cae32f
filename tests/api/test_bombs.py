"""Gzip bombs against a real API process: refused with 413 at the limit, inflated off the event
loop (so `/health` keeps answering), and never held in memory past the limit."""

from __future__ import annotations

import asyncio
import gzip
import time

import httpx
import pytest

from atropos.api import body

from .live_api import live_api, poll_health

MEMBER = gzip.compress(b"\0" * (16 << 20), 9)  # 16 MiB of zeros in ~16 KB


def bomb(inflated_mib: int) -> bytes:
    """A valid gzip stream (concatenated members) inflating to `inflated_mib` MiB."""
    return MEMBER * (inflated_mib // 16)


GZIP_JSON = {"content-encoding": "gzip", "content-type": "application/json"}


def test_bomb_stops_at_the_limit_without_building_the_rest():
    data = bomb(1024)
    assert len(data) < 1_100_000
    start = time.perf_counter()
    with pytest.raises(body.ProtocolError) as err:
        body.inflate(data, 8 << 20)
    assert err.value.status == 413
    assert "8388608 bytes" in str(err.value)
    assert time.perf_counter() - start < 0.5  # stopped at 8 MiB, not after 1 GiB


def test_concatenated_members_split_across_feeds_round_trip():
    parts = [bytes(range(256)) * 3000, b"", b"tail" * 10_000]
    data = b"".join(gzip.compress(p, 6) for p in parts)
    assert body.inflate(data, sum(map(len, parts))) == b"".join(parts)


def test_bombs_get_413_while_health_stays_fast(tmp_path):
    data = bomb(1024)

    async def scenario(url: str) -> tuple[list[int], list[float], float]:
        done = asyncio.Event()
        health = asyncio.create_task(poll_health(url, done))
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            start = time.perf_counter()
            one = await client.post("/scored_data", content=data, headers=GZIP_JSON)
            single = time.perf_counter() - start
            assert one.status_code == 413, one.text
            assert "inflates past the limit" in one.json()["detail"]
            replies = await asyncio.gather(
                *(client.post("/scored_data", content=data, headers=GZIP_JSON) for _ in range(5))
            )
        done.set()
        return [r.status_code for r in replies], await health, single

    with live_api(tmp_path) as api:
        statuses, latencies, single = asyncio.run(scenario(api.url))
    assert statuses == [413] * 5
    assert single < 3.0
    assert len(latencies) > 5
    # measured about 10 ms worst on 2 busy cores; the bound leaves room for a loaded CI
    assert max(latencies) < 0.2, sorted(latencies)[-5:]
