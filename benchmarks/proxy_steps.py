"""Where the rollout proxy's CPU per request goes, against its floor, measured inside the process.

`benchmarks/proxy_overhead.py` gives the proxy process's CPU per request; `proxy_asgi.py` the
app's own work in a process of its own. This one runs `floor` (`benchmarks/proxy_floor.py`) and
`ours` (`atropos proxy serve`) as `proxy_overhead.py` does (same fake server, same agents, same
256 x 16 load), each started through this file (`--child`), which times inside the process:

- `app`: the CPU of the app's own steps (each run of its coroutine between suspensions, the
  socket writes it makes included), and so `loop`: the rest of the process's CPU (uvicorn's
  protocol and parser, the event loop, the socket reads, the HTTP client's answer parsing);
- `client`: the inference request's steps (`inference.http.HTTPClient.request`), and, for
  `ours`, `chain`: the whole inference call (`ServerManager._call`: the manager, the backend's
  body and answer, the client);
- `slowdown`: a fixed piece of Python (dict and list work, ~0.5 ms) timed while the process is
  idle, and again between requests while the load runs: how much more CPU the same code costs
  while the agents and the fake server run beside it on this machine;
- from /proc: bytes read and written by syscalls, read and write syscalls, minor page faults,
  and collections of the garbage collector, per request.

    python benchmarks/proxy_steps.py --sessions 256 --turns 16
    python benchmarks/proxy_steps.py --sessions 32 --turns 16 --context 32000   # long prompts
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import runpy
import signal
import sys
import tempfile
import time
import types
from collections.abc import Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLOCK = time.thread_time
SPENT: dict[str, list[float]] = {}  # name -> [calls, CPU seconds]


@types.coroutine
def timed(name: str, coro: Any) -> Generator[Any, Any, Any]:
    """Await `coro`, adding the CPU of each of its steps to `SPENT[name]`."""
    value: Any = None
    error: BaseException | None = None
    spent = SPENT.setdefault(name, [0, 0.0])
    spent[0] += 1
    while True:
        t0 = CLOCK()
        try:
            yielded = coro.throw(error) if error is not None else coro.send(value)
        except StopIteration as stop:
            spent[1] += CLOCK() - t0
            return stop.value
        finally:
            error = None
        spent[1] += CLOCK() - t0
        try:
            value = yield yielded
        except BaseException as exc:
            value, error = None, exc


def wrap(owner: Any, attr: str, name: str) -> None:
    fn = getattr(owner, attr)
    setattr(owner, attr, lambda *a, **k: timed(name, fn(*a, **k)))


def work() -> int:
    d = {str(i): [i, i * 2, "x" * (i % 7)] for i in range(3000)}
    return sum(len(v[2]) for v in d.values())


def calibrate(name: str, times: int = 1) -> None:
    for _ in range(times):
        t0 = CLOCK()
        work()
        spent = SPENT.setdefault(name, [0, 0.0])
        spent[0] += 1
        spent[1] += CLOCK() - t0


def child(mode: str, argv: list[str]) -> None:
    """Run `mode`'s server with the timers; SIGUSR1 writes SPENT (and idle calibrations) to
    $PROXY_STEPS_OUT as one JSON line."""
    last = [0.0]

    def app_timer(call: Any) -> Any:
        async def timed_call(self: Any, scope: Any, receive: Any, send: Any) -> Any:
            if scope["type"] != "http":
                return await call(self, scope, receive, send)
            now = time.monotonic()
            if now - last[0] > 0.2:  # a calibration between requests, 5 a second
                last[0] = now
                calibrate("busy")
            return await timed("app", call(self, scope, receive, send))

        return timed_call

    def dump(*_: Any) -> None:
        calibrate("idle", 20)
        stats = gc.get_stats()
        row = {"cpu": time.process_time(), "gc": sum(s["collections"] for s in stats), **SPENT}
        with open(os.environ["PROXY_STEPS_OUT"], "a") as out:
            out.write(json.dumps(row) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    from atropos.inference import http

    wrap(http.HTTPClient, "request", "client")
    if mode == "floor":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import proxy_floor

        proxy_floor.Floor.__call__ = app_timer(proxy_floor.Floor.__call__)  # type: ignore[method-assign]
        sys.exit(proxy_floor.main(argv))
    from atropos.inference import manager
    from atropos.proxy import asgi

    asgi.ProxyApp.__call__ = app_timer(asgi.ProxyApp.__call__)  # type: ignore[method-assign]
    wrap(manager.ServerManager, "_call", "chain")
    sys.argv = ["atropos", *argv]
    runpy.run_module("atropos", run_name="__main__", alter_sys=True)


def proc_counters(pid: int) -> dict[str, float]:
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    names = ("rchar", "wchar", "syscr", "syscw")
    return {**{k: float(io[k]) for k in names}, "minflt": float(stat[7])}


def snapshot(pid: int, out: Path) -> dict[str, Any]:
    lines = out.read_text().splitlines() if out.exists() else []
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while len(out.read_text().splitlines() if out.exists() else []) == len(lines):
        if time.monotonic() > deadline:
            raise TimeoutError("the server wrote no timings within 30 s")
        time.sleep(0.05)
    return {**json.loads(out.read_text().splitlines()[-1]), **proc_counters(pid)}


def measure(mode: str, fake: str, fake_pid: int, args: argparse.Namespace, tmp: Path) -> dict:
    """One mode under the load: per request figures (module docstring)."""
    import proxy_overhead as po
    from procstat import cpu_seconds

    from atropos.demo.procs import wait_until_up
    from atropos.testing import free_port

    port = free_port()
    command = po.proxy_command(mode, port, fake, tmp)
    argv = command[2:] if mode == "floor" else command[3:]
    out = tmp / f"{mode}.jsonl"
    env = {**os.environ, "PROXY_STEPS_OUT": str(out)}
    proc = po.start([sys.executable, __file__, "--child", mode, *argv], tmp / f"{mode}.log", env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/health", deadline=120)
        asyncio.run(po.drive(mode, base, 8, 2))  # warm up
        before = snapshot(proc.pid, out)
        server0 = cpu_seconds(fake_pid)
        context = po.context_text(po.TOK, args.context)
        run = asyncio.run(po.drive(mode, base, args.sessions, args.turns, context=context))
        server = cpu_seconds(fake_pid) - server0
        after = snapshot(proc.pid, out)
    finally:
        po.stop(proc)
    n = run["requests"]

    def grew(key: str) -> float:
        got, had = after.get(key, 0), before.get(key, 0)
        return (got[1] - had[1]) if isinstance(got, list) else got - had

    us = {k: 1e6 * grew(k) / n for k in ("cpu", "app", "client", "chain")}
    us["loop"] = us["cpu"] - us["app"]
    busy, idle = after["busy"], after["idle"]
    idle_us = (idle[1] - before["idle"][1]) / (idle[0] - before["idle"][0])
    busy_us = (busy[1] - before["busy"][1]) / max(1, busy[0] - before["busy"][0])
    return {
        "requests": n,
        **{f"{k}_us": round(v, 1) for k, v in us.items()},
        "server_cpu_us": round(1e6 * server / n, 1),
        **{f"{k}_per_request": round(grew(k) / n, 2) for k in ("rchar", "wchar", "syscr", "syscw")},
        "minflt_per_request": round(grew("minflt") / n, 2),
        "gc_collections": grew("gc"),
        "slowdown": round(busy_us / idle_us, 2),
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT / "src"))
        child(sys.argv[2], sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument(
        "--context", type=int, default=0, help="about this many tokens in each first message"
    )
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/proxy_steps.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import proxy_overhead as po
    from procstat import code_version, machine

    from atropos.demo.procs import wait_until_up
    from atropos.testing import free_port

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port = free_port()
        fake_proc = po.start_fake(port, args.context, args.turns, tmp)
        fake = f"http://127.0.0.1:{port}/v1"
        try:
            wait_until_up(f"{fake}/models", deadline=60)
            for mode in ("floor", "ours"):
                found[mode] = measure(mode, fake, fake_proc.pid, args, tmp)
                print(mode, json.dumps(found[mode]), flush=True)
        finally:
            po.stop(fake_proc)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args), "machine": machine(), "code": code_version(), "modes": found}
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
