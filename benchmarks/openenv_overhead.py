"""The CPU per step that the OpenEnv layer adds, against the same environment run natively.

One run, side by side, for gsm8k (single-turn: one step per episode):

- native: `prompt(item)` and `score(item, reply)` called in this process;
- openenv: the same episodes through `atropos env publish gsm8k --as openenv` (a subprocess)
  and our OpenEnv client (`atropos.interop.openenv.wire.Session`, what `openenv:URL` plays
  with), `reset` + `step` per episode over one /ws session.

CPU is process CPU: this process's `time.process_time()` plus the server's utime + stime
(`/proc/PID/stat`), so both ends of the protocol are counted; the server's start-up is
excluded (measured from after the first episode). Prints one line per mode and the added CPU
per step. Usage: `nice python benchmarks/openenv_overhead.py [--episodes 500]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx

from atropos.envs import registry
from atropos.envs.cli import parse
from atropos.interop.openenv.launch import free_port
from atropos.interop.openenv.wire import Session

TICKS = os.sysconf("SC_CLK_TCK")


def server_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def native(episodes: int) -> float:
    cls = registry.get("gsm8k")
    resolved = parse(cls, "process", [])
    env = cls(resolved.env, resolved.servers, manager=resolved.manager)
    asyncio.run(env.setup())
    items = env.items
    env.score(items[0], "warm-up")  # lazy imports and compiled patterns, as the server's warm-up
    start = time.process_time()
    for i in range(episodes):
        item = items[i % len(items)]
        env.prompt(item)
        env.score(item, f"The answer is {i}")
    return (time.process_time() - start) / episodes


async def remote(url: str, episodes: int, pid: int) -> float:
    async with Session(url, timeout=30.0) as session:
        await session.reset(seed=0)
        await session.step({"message": "warm-up"})
        start, start_server = time.process_time(), server_cpu(pid)
        for i in range(episodes):
            await session.reset(seed=i)
            await session.step({"message": f"The answer is {i}"})
        used = time.process_time() - start + server_cpu(pid) - start_server
    return used / episodes


def openenv(episodes: int) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "atropos", "env", "publish", "--as", "openenv"]
    proc = subprocess.Popen([*cmd, "--port", str(port), "gsm8k"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        return asyncio.run(remote(url, episodes, proc.pid))
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    args = parser.parse_args()
    load = os.getloadavg()
    base = native(args.episodes)
    layer = openenv(args.episodes)
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.episodes} episodes")
    print(f"native  gsm8k: {base * 1e3:.3f} ms CPU per step")
    print(f"openenv gsm8k: {layer * 1e3:.3f} ms CPU per step (client + server)")
    print(f"added by the OpenEnv layer: {(layer - base) * 1e3:.3f} ms CPU per step")


if __name__ == "__main__":
    main()
