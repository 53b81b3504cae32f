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
from pathlib import Path

import httpx

from atropos.interop.openenv.wire import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers beside us
from interop_overhead import native  # noqa: E402
from procstat import cpu_seconds, free_port  # noqa: E402


async def remote(url: str, episodes: int, pid: int) -> float:
    async with Session(url, timeout=30.0) as session:
        await session.reset(seed=0)
        await session.step({"message": "warm-up"})
        start, start_server = time.process_time(), cpu_seconds(pid)
        for i in range(episodes):
            await session.reset(seed=i)
            await session.step({"message": f"The answer is {i}"})
        used = time.process_time() - start + cpu_seconds(pid) - start_server
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
