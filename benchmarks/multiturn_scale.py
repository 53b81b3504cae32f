#!/usr/bin/env python3
"""Multi-turn rollouts at scale: one environment process with 256 to 16,384 rollouts in flight.

Each rollout is a conversation of `--turns` turns through one `ManagedServer` session
(`ServerManager.managed_server`, sticky routing): a system prompt and a question, then per turn
one `chat_turn` (its own `/generate` request for token ids and logprobs) and a tool message
appended to the conversation, the way a tool-using environment runs. At the end the rollout
reads its one token-exact node (tokens, masks, logprobs), as an environment does to score.

The inference servers are lean stubs (`--servers` processes, raw asyncio HTTP/1.1 on uvloop
answering vLLM's `/generate` after `--latency` seconds with a fixed 6-token reply), each its own
process, so the measured CPU is the env process's own and the servers are no bottleneck. The
env runs in a child process per configuration (a fresh heap), on uvloop, with the runners' GC
settings (`FrozenHeap`), `--in-flight` workers each running rollouts back to back.

After `--warmup` seconds we measure a `--duration` second window: turns finished, the env
process's CPU (`time.process_time`, user + system) per turn, turns/s, p50/p99 turn latency
(the `chat_turn` call, request and local work), and RSS (`/proc/self/statm`, sampled every
0.25 s) at its peak during the run minus the baseline before the first rollout, divided by the
rollouts in flight. Then the workers stop starting rollouts and every rollout in flight must
finish within `--deadline` seconds ("no stall"; the longest rollout is reported). A progress
line (turns/s) is printed every second.

Usage:
    nice .venv/bin/python benchmarks/multiturn_scale.py \
        --in-flight 256 4096 16384 --json benchmarks/results/multiturn_scale.json
    nice .venv/bin/python benchmarks/multiturn_scale.py --in-flight 16384 --profile runs/mt.prof

Every server binds 127.0.0.1 and is stopped (by its pid) when the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPLY_TEXT = "Let me call the tool."
SYSTEM = "You are an agent. Call the tool, read its result, and answer."


# --- the lean stub server -----------------------------------------------------------------------


def _answer(ids: list[int]) -> bytes:
    """The `/generate` answer body for one choice of `ids` (logprob -0.5 each)."""
    positions = [[{str(t): -0.5}] for t in ids]
    return json.dumps({"logprobs": [positions], "finish_reasons": ["stop"]}).encode()


class _Stub(asyncio.Protocol):
    """HTTP/1.1 keep-alive: `GET /health` -> 200, `POST /generate` -> the fixed answer after
    the latency. Requests on one connection are answered in order (one at a time here)."""

    def __init__(self, body: bytes, latency: float) -> None:
        self.body, self.latency = body, latency
        self.buf = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            if head.startswith("GET"):
                self._send(b"{}")
            else:
                asyncio.get_running_loop().call_later(self.latency, self._send, self.body)

    def _send(self, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            )
            self.transport.write(head % len(body) + body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def stub_main(port: int, latency: float) -> None:
    """Serve the stub on 127.0.0.1:`port` until killed."""
    import uvloop

    from atropos.testing.fake_engine import load_tokenizer

    tok = load_tokenizer()
    body = _answer([*tok.encode(REPLY_TEXT), tok.eos_token_id])

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Stub(body, latency), "127.0.0.1", port, backlog=16384
        )
        await server.serve_forever()

    uvloop.run(serve())


# --- the environment ------------------------------------------------------------------------


class Stats:
    """What the window measures, plus the stall check."""

    def __init__(self) -> None:
        self.turns = 0
        self.all_turns = 0
        self.rollouts = 0
        self.latencies: list[float] = []
        self.measuring = False
        self.stopping = False
        self.longest = 0.0
        self.tokens = 0


async def rollout(manager: Any, tokenizer: Any, turns: int, stats: Stats, item: int) -> None:
    """One conversation of `turns` turns through one ManagedServer session."""
    start = time.monotonic()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Question {item}: what does the tool say?"},
    ]
    async with manager.managed_server(tokenizer) as managed:
        for turn in range(turns):
            began = time.monotonic()
            reply = await managed.chat_turn(messages=messages, max_tokens=8, temperature=1.0)
            stats.all_turns += 1
            if stats.measuring:
                stats.turns += 1
                stats.latencies.append(time.monotonic() - began)
            messages.append({"role": "assistant", "content": reply.contents[0]})
            messages.append({"role": "user", "content": f"Tool result {turn}: 42 at step {item}."})
        node = managed.nodes[-1]
        stats.tokens += sum(1 for m in node.masked_tokens if m != -100)
    if stats.measuring:
        stats.rollouts += 1
    stats.longest = max(stats.longest, time.monotonic() - start)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _raise_open_files(in_flight: int) -> None:
    """One connection per rollout waiting on a server: the open-file limit must exceed the
    rollouts in flight (raised to the hard limit; refused when even that is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < in_flight + 1024:
        raise SystemExit(
            f"{in_flight} rollouts in flight need more than {in_flight + 1024} open files; the"
            f" hard limit is {hard}: raise it (ulimit -Hn) or run fewer"
        )


async def env_run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the env at `args.in_flight` workers; the window's figures."""
    _raise_open_files(args.in_flight)
    from atropos.envs.runner.heap import FrozenHeap
    from atropos.inference.config import APIServerConfig, ServerManagerConfig
    from atropos.inference.manager import ServerManager
    from atropos.testing.fake_engine import load_tokenizer

    tokenizer = load_tokenizer()
    per_server = args.in_flight  # no cap below the rollouts in flight
    configs = [
        APIServerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            server_type="vllm",
            vllm_token_api="generate",
            model_name="atropos-tiny",
            num_max_requests_at_once=per_server,
            timeout=args.deadline,
        )
        for port in args.ports
    ]
    stats = Stats()
    peak = [0]
    gc_time = _gc_timer()

    async def worker(w: int, manager: Any) -> None:
        i = w
        while not stats.stopping:
            await rollout(manager, tokenizer, args.turns, stats, i)
            i += args.in_flight

    async def sample_rss() -> None:
        while True:
            peak[0] = max(peak[0], _rss())
            await asyncio.sleep(0.25)

    with FrozenHeap() as heap:
        if args.gc:
            import gc

            gc.set_threshold(*args.gc)
        async with ServerManager(configs, ServerManagerConfig()) as manager:
            await rollout(manager, tokenizer, 1, stats, -1)  # connections, tokenizer, codecs
            heap.settle()
            base = _rss()
            sampler = asyncio.create_task(sample_rss())
            tasks = [asyncio.create_task(worker(w, manager)) for w in range(args.in_flight)]
            await _progress(stats, args.warmup, "warmup")
            stats.measuring = True
            cpu0, t0, gc0 = time.process_time(), time.monotonic(), gc_time()
            profiler = _start_profile(args.profile)
            await _progress(stats, args.duration, "window")
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
            gc_s = gc_time() - gc0
            stats.measuring = False
            stats.stopping = True
            drained = time.monotonic()
            done, pending = await asyncio.wait(tasks, timeout=args.deadline)
            drain = time.monotonic() - drained
            sampler.cancel()
            for task in pending:
                task.cancel()
            for task in done:
                task.result()  # a failed rollout fails the run
    lat = sorted(stats.latencies) or [0.0]
    return {
        "in_flight": args.in_flight,
        "turns_per_rollout": args.turns,
        "window_s": round(wall, 2),
        "turns": stats.turns,
        "rollouts": stats.rollouts,
        "turns_per_s": round(stats.turns / wall, 1),
        "env_cpu_s": round(cpu, 2),
        "env_cpu_us_per_turn": round(cpu / max(stats.turns, 1) * 1e6, 1),
        "env_cores": round(cpu / wall, 2),
        "gc_share": round(gc_s / cpu, 3),
        "p50_turn_s": round(lat[len(lat) // 2], 3),
        "p99_turn_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
        "rss_base_mb": round(base / 2**20, 1),
        "rss_peak_mb": round(peak[0] / 2**20, 1),
        "kb_per_in_flight": round((peak[0] - base) / args.in_flight / 1024, 1),
        "drain_s": round(drain, 2),
        "stalled": len(pending),
        "longest_rollout_s": round(stats.longest, 2),
    }


def _gc_timer() -> Any:
    """A function giving the process CPU seconds spent in garbage collection so far."""
    import gc

    spent, started = [0.0], [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent[0] += time.process_time() - started[0]

    gc.callbacks.append(callback)
    return lambda: spent[0]


async def _progress(stats: Stats, seconds: float, label: str) -> None:
    """Sleep `seconds`, printing turns/s (all turns, measured or not) every second."""
    end = time.monotonic() + seconds
    seen, last = _count(stats), time.monotonic()
    while (now := time.monotonic()) < end:
        await asyncio.sleep(min(1.0, end - now))
        count, now = _count(stats), time.monotonic()
        rate = (count - seen) / max(now - last, 1e-9)
        print(f"  {label}: {rate:8.0f} turns/s", file=sys.stderr, flush=True)
        seen, last = count, now


def _count(stats: Stats) -> int:
    return stats.all_turns


def _start_profile(path: str | None) -> Any:
    if not path:
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


# --- the driver -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the stub on port {port} did not listen in time")


def run_one(args: argparse.Namespace, in_flight: int) -> dict[str, Any]:
    """Start the stubs, run the env child at `in_flight`, stop the stubs (by pid)."""
    ports = [_free_port() for _ in range(args.servers)]
    me = str(Path(__file__).resolve())
    stubs = [
        subprocess.Popen([sys.executable, me, "--stub", str(p), "--latency", str(args.latency)])
        for p in ports
    ]
    try:
        for p in ports:
            _wait_listening(p, time.monotonic() + 30)
        cmd = [
            sys.executable, me, "--env", "--in-flight", str(in_flight),
            "--turns", str(args.turns), "--warmup", str(args.warmup),
            "--duration", str(args.duration), "--deadline", str(args.deadline),
            "--ports", *map(str, ports),
        ]  # fmt: skip
        if args.profile:
            cmd += ["--profile", f"{args.profile}.{in_flight}"]
        if args.gc:
            cmd += ["--gc", *map(str, args.gc)]
        limit = args.warmup + args.duration + args.deadline + 120
        out = subprocess.run(cmd, stdout=subprocess.PIPE, timeout=limit, check=True)
        result: dict[str, Any] = json.loads(out.stdout)
        return result
    finally:
        for stub in stubs:
            stub.kill()
            stub.wait(timeout=10)


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [
        "in_flight", "turns_per_s", "env_cpu_us_per_turn", "env_cores", "p50_turn_s",
        "p99_turn_s", "gc_share", "kb_per_in_flight", "rss_peak_mb", "drain_s", "longest_rollout_s",
        "stalled",
    ]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--in-flight", type=int, nargs="+", default=[256, 4096, 16384])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--warmup", type=float, default=20)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--deadline", type=float, default=300)
    p.add_argument("--json")
    p.add_argument(
        "--gc", type=int, nargs=3, help="gc thresholds in the env (default: the runners')"
    )
    p.add_argument("--profile")
    p.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    p.add_argument("--env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ports", type=int, nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stub:
        stub_main(args.stub, args.latency)
        return 0
    if args.env:
        import uvloop

        args.in_flight = args.in_flight[0]
        print(json.dumps(uvloop.run(env_run(args))))
        return 0
    rows = []
    for n in args.in_flight:
        print(f"in flight {n}:", file=sys.stderr, flush=True)
        rows.append(run_one(args, n))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    base = rows[0]["env_cpu_us_per_turn"]
    for row in rows:
        row["cpu_per_turn_vs_first"] = round(row["env_cpu_us_per_turn"] / base, 2)
    print(_table(rows))
    if args.json:
        meta = {"load_avg": os.getloadavg(), "nproc": os.cpu_count(), "args": vars(args)}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
