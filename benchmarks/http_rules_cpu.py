#!/usr/bin/env python3
"""What the one set of HTTP rules (`atropos.http.HttpRules`) costs each server we ship: server
CPU per ordinary request with the rules on (as shipped) and off, side by side in one run.

"Off" is the same server, built the same way, started through benchmarks/http_rules_launch.py,
which replaces `HttpRules.__call__` by a pass-through before the server's module runs; "on" is
started through the same launcher unchanged. Both servers of a kind run at once; each round
sends N sequential requests on one keep-alive connection (httpx) to one, then to the other (the
order alternates by round), after a warm-up of N/10 requests each. Server CPU is utime+stime
of the server's process tree from /proc/PID/stat (benchmarks/procstat.py) read just before and
after the N requests; reported as µs per request, median and min-max over the rounds, and the
difference on - off (median of each round's difference).

Cases (the ordinary requests of each server):

- api: `POST /scored_data` of a small group (8 sequences of 128 tokens, made and gzipped as
  benchmarks/api_throughput.py makes them) then `GET /batch` (batch size 8: one batch back);
  one pair counts as one request.
- local (`atropos local serve tiny`): `GET /health`, `GET /v1/models`, and `POST
  /v1/completions` of 1 token (N/10 of these: generation dominates).
- proxy (`atropos proxy serve` over the fake server): `GET /v1/models`, and `POST
  /v1/chat/completions` of a 4-token answer in one session (the proxy process's CPU only).
- fake (`python -m atropos.testing.fake_server`): `POST /v1/completions` of 4 tokens.

The launcher prints `http rules bypassed` on the first request an "off" server passes through;
`rules in path` says whether it did (a server without HttpRules in front of its routes measures
the same thing twice).

Usage:
    .venv/bin/python benchmarks/http_rules_cpu.py
    .venv/bin/python benchmarks/http_rules_cpu.py --requests 2000 --rounds 3 --json out.json
    .venv/bin/python benchmarks/http_rules_cpu.py --only api,fake --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from procstat import (  # noqa: E402
    code_version,
    cpu_seconds,
    free_port,
    machine,
    machine_busy_seconds,
    wait_quiet,
)

from atropos.demo import Service, wait_until_up  # noqa: E402

LAUNCH = str(ROOT / "benchmarks" / "http_rules_launch.py")
MODES = ("on", "off")
SERVERS = ("api", "local", "proxy", "fake")
TURNS = 8  # the proxy's chat calls per session (an agent's short conversation)
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Case:
    server: str
    name: str
    send: Callable[[httpx.Client], None]  # one ordinary request (or pair)
    share: float = 1.0  # of --requests
    prepare: Callable[[str, int], None] | None = None  # before each timed run: mode, requests


class Pair:
    """One kind of server running twice, rules on and rules off."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp, self.name = tmp, name
        self.services: dict[str, Service] = {}
        self.urls: dict[str, str] = {}

    def start(
        self,
        mode: str,
        module: str,
        args: list[str],
        as_: str | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        """Start `module` in `mode`, known as `as_` (default: the mode)."""
        name = as_ or mode
        port = free_port()
        argv = [
            sys.executable,
            LAUNCH,
            mode,
            module,
            *(a.replace("{port}", str(port)) for a in args),
        ]
        service = Service(f"{self.name}-{name}", argv, self.tmp / f"{self.name}-{name}.log")
        self.services[name] = service.start(env)
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url + "/health", deadline=180, service=service)
        self.urls[name] = url
        return url

    def pid(self, mode: str) -> int:
        proc = self.services[mode].proc
        assert proc is not None
        return proc.pid

    def bypassed(self) -> bool:
        log = self.services["off"].log_path
        return "http rules bypassed" in log.read_text(errors="replace")

    def stop(self) -> None:
        for service in self.services.values():
            with contextlib.suppress(Exception):
                service.stop(grace=10)


def _ok(r: httpx.Response) -> None:
    if r.status_code >= 300:
        raise RuntimeError(
            f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:300]}"
        )


# ----- the servers ----------------------------------------------------------------------------


def api_setup(pair: Pair) -> list[Case]:
    from api_throughput import Workload, encode_body

    w = Workload(group_size=8, seq_len=128, prompt_len=32, batch_size=8, envs=1)
    bodies = [encode_body(w, i) for i in range(64)]
    for mode in MODES:
        args = ["api", "serve", "--port", "{port}", "--store", f"sqlite:{pair.tmp}/api-{mode}.db"]
        url = pair.start(mode, "atropos", args)
        reg = {"wandb_group": "g", "wandb_project": "p", "batch_size": 8, "max_token_len": 128}
        reg |= {"checkpoint_dir": "c", "save_checkpoint_interval": 0, "starting_step": 0}
        reg |= {"num_steps": 10**6}
        env = {"max_token_length": 128, "desired_name": "e", "weight": 1.0, "group_size": 8}
        with httpx.Client(base_url=url, timeout=60) as c:
            _ok(c.post("/register", json=reg))
            _ok(c.get("/batch"))
            _ok(c.post("/register-env", json=env))
    counter = iter(range(10**12))

    def pair_request(c: httpx.Client) -> None:
        body = bodies[next(counter) % len(bodies)]
        headers = {"content-type": "application/json", "accept-encoding": "gzip"}
        if body.gzipped:
            headers["content-encoding"] = "gzip"
        _ok(c.post("/scored_data", content=body.data, headers=headers))
        r = c.get("/batch", headers={"accept-encoding": "gzip"})
        _ok(r)
        if r.json().get("batch") is None:
            raise RuntimeError("GET /batch: no batch after a whole group")

    return [Case("api", "POST /scored_data + GET /batch", pair_request)]


def local_setup(pair: Pair) -> list[Case]:
    for mode in MODES:
        args = ["local", "serve", "tiny", "--port", "{port}"]
        pair.start(mode, "atropos", args, env={"OMP_NUM_THREADS": "1"})
    model = httpx.get(pair.urls["on"] + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    return [
        Case("local", "GET /health", lambda c: _ok(c.get("/health"))),
        Case("local", "GET /v1/models", lambda c: _ok(c.get("/v1/models"))),
        Case(
            "local",
            "POST /v1/completions (1 token)",
            lambda c: _ok(c.post("/v1/completions", json=body)),
            0.1,
        ),
    ]


def proxy_setup(pair: Pair) -> list[Case]:
    fake = pair.start("on", "atropos.testing.fake_server", ["--port", "{port}"], "upstream")
    urls: dict[str, str] = {}
    for mode in MODES:
        args = ["proxy", "serve", "--port", "{port}", "--openai.base_url", f"{fake}/v1"]
        args += ["--openai.server_type", "vllm", "--openai.model_name", "atropos-tiny"]
        args += ["--env.tokenizer_name", "tiny"]
        urls[pair.start(mode, "atropos", args)] = mode
    keys: dict[str, list[str]] = {m: [] for m in MODES}
    calls = iter(range(10**12))

    def sessions(mode: str, n: int) -> None:
        """Sessions of `TURNS` calls each for the next `n` calls, made before the timing."""
        keys[mode].clear()
        for _ in range(n // TURNS + 1):
            r = httpx.post(pair.urls[mode] + "/sessions", json={}, timeout=30)
            _ok(r)
            keys[mode].append(r.json()["api_key"])

    def chat(c: httpx.Client) -> None:
        mine = keys[urls[str(c.base_url).rstrip("/")]]
        key = mine[next(calls) // TURNS % len(mine)]
        _ok(c.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}))

    return [
        Case("proxy", "GET /v1/models", lambda c: _ok(c.get("/v1/models"))),
        Case("proxy", f"POST /v1/chat/completions (over fake, {TURNS} per session)", chat,
             prepare=sessions),
    ]  # fmt: skip


def fake_setup(pair: Pair) -> list[Case]:
    for mode in MODES:
        pair.start(mode, "atropos.testing.fake_server", ["--port", "{port}"])
    body = {"model": "atropos-tiny", "prompt": "hi", "max_tokens": 4}
    return [
        Case("fake", "POST /v1/completions", lambda c: _ok(c.post("/v1/completions", json=body)))
    ]


SETUPS = {"api": api_setup, "local": local_setup, "proxy": proxy_setup, "fake": fake_setup}


# ----- measuring ------------------------------------------------------------------------------


def measure(
    pair: Pair, case: Case, mode: str, clients: dict[str, httpx.Client], n: int
) -> tuple[float, float]:
    """µs of server CPU per request over `n` requests, and the cores everything else on the
    machine used meanwhile (not the server, not this client)."""
    if case.prepare is not None:
        case.prepare(mode, n)
    wait_quiet(20)
    client, pid = clients[mode], pair.pid(mode)
    t0, busy0, me0, server0 = time.monotonic(), machine_busy_seconds(), _me(), cpu_seconds(pid)
    for _ in range(n):
        case.send(client)
    server = cpu_seconds(pid) - server0
    others = machine_busy_seconds() - busy0 - server - (_me() - me0)
    return server / n * 1e6, max(others, 0.0) / (time.monotonic() - t0)


def _me() -> float:
    times = os.times()
    return times.user + times.system


def run_case(pair: Pair, case: Case, requests: int, rounds: int) -> dict[str, Any]:
    n = max(int(requests * case.share), 20)
    clients = {m: httpx.Client(base_url=pair.urls[m], timeout=120) for m in MODES}
    try:
        warm = max(n // 10, 5)
        for mode in MODES:  # warm-up
            if case.prepare is not None:
                case.prepare(mode, warm)
            for _ in range(warm):
                case.send(clients[mode])
        per: dict[str, list[float]] = {m: [] for m in MODES}
        others: list[float] = []
        for r in range(rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                us, load = measure(pair, case, mode, clients, n)
                per[mode].append(us)
                others.append(load)
            print(
                f"  {case.server:6s} {case.name:40s} round {r + 1}/{rounds}: on"
                f" {per['on'][-1]:7.1f} µs, off {per['off'][-1]:7.1f} µs ({n} requests each)",
                flush=True,
            )
    finally:
        for c in clients.values():
            c.close()
    diffs = [a - b for a, b in zip(per["on"], per["off"], strict=True)]
    return {
        "server": case.server, "case": case.name, "requests": n, "on_us": per["on"],
        "off_us": per["off"], "diff_us": diffs, "others_cores_max": round(max(others), 2),
    }  # fmt: skip


HEADERS = [  # what httpx sends, as a uvicorn scope holds it
    (b"host", b"127.0.0.1:8000"),
    (b"accept", b"*/*"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
    (b"user-agent", b"python-httpx/0.28.1"),
]
START = {"type": "http.response.start", "status": 200, "headers": []}
BODY = {"type": "http.response.body", "body": b"{}"}


def in_process(n: int, rounds: int) -> list[dict[str, Any]]:
    """µs of CPU `HttpRules` adds to one request in process: an app that reads the body and
    answers, called `n` times bare and `n` times behind `HttpRules` (loopback rules), on one
    event loop, rounds alternating; no sockets, no parser, so nothing else varies."""
    from atropos.http import HttpRules, Rules

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["method"] == "POST":
            await receive()
        await send(START)
        await send(BODY)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        return None

    guarded = HttpRules(app, Rules.loopback())
    post = [*HEADERS, (b"content-type", b"application/json"), (b"content-length", b"2")]
    scopes = {
        "GET /v1/models": {
            "type": "http", "method": "GET", "path": "/v1/models", "headers": HEADERS,
        },
        "POST /v1/completions": {
            "type": "http", "method": "POST", "path": "/v1/completions", "headers": post,
        },
    }  # fmt: skip

    async def timed(target: Any, scope: Any) -> float:
        start = time.process_time()
        for _ in range(n):
            await target(scope, receive, send)
        return (time.process_time() - start) / n * 1e6

    rows = []
    for name, scope in scopes.items():
        on: list[float] = []
        off: list[float] = []
        for r in range(rounds):
            for target in (guarded, app) if r % 2 == 0 else (app, guarded):
                (on if target is guarded else off).append(asyncio.run(timed(target, scope)))
        rows.append({"request": name, "calls": n, "on_us": on, "off_us": off})
        shown = f"on {statistics.median(on):.2f} µs, off {statistics.median(off):.2f} µs"
        print(f"  in process {name:22s} {shown} ({n} calls x {rounds})", flush=True)
    return rows


def micro_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| request (in process, app that answers at once) | behind HttpRules, µs | bare app, µs |"
        " HttpRules adds, µs |",
        "|---|---|---|---|",
    ]
    for r in rows:
        on, off = statistics.median(r["on_us"]), statistics.median(r["off_us"])
        lines.append(f"| {r['request']} | {on:.2f} | {off:.2f} | {on - off:+.2f} |")
    return "\n".join(lines)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| server | ordinary request | requests/round | rules on, µs CPU/request | rules off |"
        " on - off, µs | on - off, % | rules in path | others' load, cores (max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        off = statistics.median(r["off_us"])
        diff = statistics.median(r["diff_us"])
        share = f"{diff / off * 100:+.1f}%" if off else "-"
        lines.append(
            f"| {r['server']} | {r['case']} | {r['requests']} | {_cell(r['on_us'])} |"
            f" {_cell(r['off_us'])} | {diff:+.1f} ({min(r['diff_us']):+.0f} to"
            f" {max(r['diff_us']):+.0f}) | {share} | {'yes' if r['bypassed'] else 'no'} |"
            f" {r['others_cores_max']:.2f} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def started(tmp: Path, name: str) -> Iterator[tuple[Pair, list[Case]]]:
    pair = Pair(tmp, name)
    try:
        yield pair, SETUPS[name](pair)
    finally:
        pair.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the servers as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per case and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (on and off each, alternating)")
    p.add_argument("--only", help=f"comma-separated servers of {', '.join(SERVERS)}")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--calls", type=int, default=200_000, help="in-process calls per round")
    args = p.parse_args(argv)
    only = args.only.split(",") if args.only else list(SERVERS)
    if set(only) - set(SERVERS):
        p.error(f"unknown servers: {sorted(set(only) - set(SERVERS))}")
    results: list[dict[str, Any]] = []
    start = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    print("HttpRules in process", flush=True)
    micro = in_process(args.calls, args.rounds)
    with tempfile.TemporaryDirectory(prefix="http_rules_cpu_") as tmp:
        try:
            for name in only:
                print(f"{name}: starting rules on and off", flush=True)
                with started(Path(tmp), name) as (pair, cases):
                    for case in cases:
                        row = run_case(pair, case, args.requests, args.rounds)
                        row["bypassed"] = pair.bypassed()
                        results.append(row)
        except KeyboardInterrupt:
            print("interrupted: every server stopped; partial results below", flush=True)
    print(f"\n{time.monotonic() - start:.0f} s\n")
    print(micro_table(micro) + "\n")
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": machine(),
            "code": code_version(),
            "results": results,
            "in_process": micro,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
