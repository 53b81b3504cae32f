#!/usr/bin/env python3
"""How a real `atropos api serve` holds up under hostile requests: gzip bombs, huge and
numerous headers, a header dripped in slowly. For each scenario, one client polls `/health`
every 10 ms on its own connection while the attackers run; we report the worst and median
`/health` latency, the server's peak RSS during the scenario (VmHWM, reset before each one
through /proc/PID/clear_refs; sampled VmRSS where that is not allowed) and the statuses the
attackers got (`reset`: the server closed the connection before an answer could be read).

Usage:
    .venv/bin/python benchmarks/hostile_load.py
    .venv/bin/python benchmarks/hostile_load.py --rounds 5 --json runs/hostile_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from atropos.demo import Service, wait_until_up
from atropos.testing import free_port, send_head

MEMBER = gzip.compress(b"\0" * (16 << 20), 9)
BOMB = MEMBER * 64  # about 1 MB that inflates to 1 GiB
GZIP_JSON = {"content-encoding": "gzip", "content-type": "application/json"}


def rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def status_of(host: str, port: int, head: bytes, pace: float = 0.0, piece: int = 1 << 20) -> str:
    """Send a raw request head; the status code the server answered, or 'reset'."""
    answer = send_head(f"http://{host}:{port}", head, pace, piece, timeout=30)
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else "reset"


def head_with(extra: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


async def bombs(url: str, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        replies = await asyncio.gather(
            *(client.post("/scored_data", content=BOMB, headers=GZIP_JSON) for _ in range(n))
        )
    return [str(r.status_code) for r in replies]


async def heads(
    url: str, n: int, head: bytes, pace: float = 0.0, piece: int = 1 << 20
) -> list[str]:
    host, port = url.removeprefix("http://").split(":")
    return list(
        await asyncio.gather(
            *(asyncio.to_thread(status_of, host, int(port), head, pace, piece) for _ in range(n))
        )
    )


async def measure(url: str, pid: int, attack: Callable[[], Awaitable[list[str]]]) -> dict[str, Any]:
    exact = reset_peak(pid)
    sampled = rss_mib(pid, "VmRSS")
    latencies: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        nonlocal sampled
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await client.get("/health")
            while not done.is_set():
                start = time.perf_counter()
                await client.get("/health")
                latencies.append(time.perf_counter() - start)
                sampled = max(sampled, rss_mib(pid, "VmRSS"))
                await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(0.1)
    start = time.perf_counter()
    statuses = await attack()
    wall = time.perf_counter() - start
    await asyncio.sleep(0.05)
    done.set()
    await poller
    return {
        "requests": len(statuses),
        "wall_s": round(wall, 2),
        "worst_ms": round(max(latencies) * 1000, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "health_polls": len(latencies),
        "peak_rss_mib": round(rss_mib(pid, "VmHWM") if exact else sampled, 1),
        "statuses": dict(Counter(statuses)),
    }


def scenarios(url: str, rounds: int) -> dict[str, Callable[[], Awaitable[list[str]]]]:
    async def repeat(make: Callable[[], Awaitable[list[str]]]) -> list[str]:
        out: list[str] = []
        for _ in range(rounds):
            out += await make()
        return out

    big = head_with(b"X-Big: " + b"a" * (16 << 20) + b"\r\n")
    many = head_with(b"".join(b"X-%d: v\r\n" % i for i in range(10_000)))
    slow = head_with(b"X-Slow: " + b"a" * (256 << 10) + b"\r\n")

    async def mixed() -> list[str]:
        parts = await asyncio.gather(bombs(url, 5), heads(url, 5, big), heads(url, 5, many))
        return [s for part in parts for s in part]

    return {
        "idle": lambda: asyncio.sleep(1.0, result=[]),
        "5 gzip bombs at once (1 MB -> 1 GiB)": lambda: repeat(lambda: bombs(url, 5)),
        "5 headers of 16 MiB at once": lambda: repeat(lambda: heads(url, 5, big)),
        "5 x 10,000 headers at once": lambda: repeat(lambda: heads(url, 5, many)),
        "5 slow 256 KiB headers (4 KiB / 5 ms)": lambda: heads(url, 5, slow, 0.005, 4096),
        "bombs + big headers + many headers": lambda: repeat(mixed),
    }


async def run_all(url: str, pid: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for name, attack in scenarios(url, rounds).items():
        rows.append({"scenario": name, **await measure(url, pid, attack)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["scenario", "requests", "worst_ms", "p50_ms", "peak_rss_mib", "statuses"]
    names = ["scenario", "requests", "worst /health ms", "p50 ms", "peak RSS MiB", "statuses"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [
            ", ".join(f"{k}: {v}" for k, v in r[c].items()) if c == "statuses" else str(r[c])
            for c in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="waves of attackers per scenario")
    p.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        argv = ["api", "serve", "--port", str(port), "--store", f"sqlite:{tmp}/api.db"]
        service = Service.atropos("api", argv, Path(tmp) / "api.log").start()
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(f"{url}/health", deadline=30, service=service)
            assert service.proc is not None
            rows = asyncio.run(run_all(url, service.proc.pid, args.rounds))
        finally:
            service.stop(grace=10)
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
