"""The CPU per step that the ORS layer adds, against the same environment run natively.

One run, side by side, for gsm8k (single-turn: one step per episode):

- native: `prompt(item)` and `score(item, reply)` called in this process;
- ors: the same episodes through `atropos env publish gsm8k --as ors` (a subprocess) and our
  ORS client (`atropos.interop.ors.client`, what `ors:URL#ENV` plays with): per episode what
  the consumer does, a session opened (`/create_session` + `/create`), its prompt and tools
  read, one `answer` call (SSE), the session deleted (`/delete` + `/delete_session`).

CPU is process CPU: this process's `time.process_time()` plus the server's utime + stime
(`/proc/PID/stat`), so both ends of the protocol are counted; the server's start-up is excluded
(measured from after a warm-up episode). The OpenEnv layer has its sibling,
benchmarks/openenv_overhead.py. Usage: `nice python benchmarks/interop_overhead.py
[--episodes 300] [--official PYTHON]`; `--official` (default: the interop venv's python) also
drives the same episodes with openreward's own client (its process CPU, and the server's).
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

from atropos.envs import registry
from atropos.envs.cli import parse
from atropos.interop.ors.client import ORSClient

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers beside us
from procstat import cpu_seconds, free_port  # noqa: E402


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
        env.score(item, f"The answer is \\boxed{{{i}}}")
    return (time.process_time() - start) / episodes


async def episode(client: ORSClient, index: int, answer: str) -> None:
    session = await client.open("train", index)
    try:
        await session.prompt()
        await session.tools()
        await session.call("answer", {"answer": answer})
    finally:
        await session.close()


async def remote(url: str, episodes: int, pid: int) -> tuple[float, float]:
    """(this process's CPU per episode: our client; the server's CPU per episode)."""
    client = ORSClient(url, "gsm8k")
    count = await client.num_tasks("train")
    await episode(client, 0, "warm-up")
    start, start_server = time.process_time(), cpu_seconds(pid)
    for i in range(episodes):
        await episode(client, i % count, f"The answer is \\boxed{{{i}}}")
    ours, theirs = time.process_time() - start, cpu_seconds(pid) - start_server
    await client.aclose()
    return ours / episodes, theirs / episodes


OFFICIAL = """
import sys, time
from openreward import OpenReward
url, episodes = sys.argv[1], int(sys.argv[2])
client = OpenReward(base_url=url)
env = client.environments.get(name="gsm8k", variant="gsm8k", base_url=url)
count = env.num_tasks("train")
def episode(i, answer):
    with env.session(split="train", index=i % count) as session:
        session.get_prompt()
        session.list_tools()
        session.call_tool("answer", {"answer": answer})
episode(0, "warm-up")
start = time.process_time()
for i in range(episodes):
    episode(i, f"The answer is \\\\boxed{{{i}}}")
print((time.process_time() - start) / episodes)
client.close()
"""


def official(python: str, url: str, episodes: int, pid: int) -> tuple[float, float]:
    """(openreward's client CPU per episode, the server's) for the same episodes, the client
    run by `python` (the interop venv's); the server's share includes the client's start."""
    extra = {"OPENREWARD_DISABLE_UPDATE_CHECK": "1", "OPENREWARD_SESSION_URL": url}
    start_server = cpu_seconds(pid)
    done = subprocess.run(
        [python, "-c", OFFICIAL, url, str(episodes)], env={**os.environ, **extra},
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    theirs = float(done.stdout.split()[-1])
    return theirs, (cpu_seconds(pid) - start_server) / (episodes + 1)


def serve(port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "atropos", "env", "publish", "gsm8k", "--as", "ors"]
    server = subprocess.Popen([*argv, "--port", str(port)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise TimeoutError("the ORS server did not start within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    venv = ".cache/interop-venv/bin/python"
    parser.add_argument("--official", default=venv, help="python with openreward ('': skip)")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    port = free_port()
    server = serve(port)
    url = f"http://127.0.0.1:{port}"
    try:
        client, served = asyncio.run(remote(url, args.episodes, server.pid))
        if args.official:
            theirs, served_theirs = official(args.official, url, args.episodes, server.pid)
            print(
                f"openreward's client {theirs * 1e3:7.3f} ms + server {served_theirs * 1e3:7.3f} ms"
            )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    base = native(args.episodes)
    print(f"native  {base * 1e3:8.3f} ms CPU per step")
    ors = client + served
    print(f"ors     {ors * 1e3:8.3f} ms CPU per step (client + server)")
    print(f"  client {client * 1e3:7.3f} ms (atropos.interop.ors.client, this process)")
    print(f"  server {served * 1e3:7.3f} ms (env publish --as ors; its score included)")
    print(f"added   {(ors - base) * 1e3:8.3f} ms CPU per step ({args.episodes} episodes)")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
