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
import contextlib
import json
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

from procstat import code_version, cpu_seconds, free_port, machine  # noqa: E402

from atropos.demo import Service, wait_until_up  # noqa: E402

LAUNCH = str(ROOT / "benchmarks" / "http_rules_launch.py")
MODES = ("on", "off")
SERVERS = ("api", "local", "proxy", "fake")
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Case:
    server: str
    name: str
    send: Callable[[httpx.Client], None]  # one ordinary request (or pair)
    share: float = 1.0  # of --requests


class Pair:
    """One kind of server running twice, rules on and rules off."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp, self.name = tmp, name
        self.services: dict[str, Service] = {}
        self.urls: dict[str, str] = {}

    def start(self, mode: str, module: str, args: list[str], as_: str | None = None) -> str:
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
        self.services[name] = service.start()
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
        pair.start(mode, "atropos", ["local", "serve", "tiny", "--port", "{port}"])
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
    keys: dict[str, str] = {}
    for mode in MODES:
        args = ["proxy", "serve", "--port", "{port}", "--openai.base_url", f"{fake}/v1"]
        args += ["--openai.server_type", "vllm", "--openai.model_name", "atropos-tiny"]
        args += ["--env.tokenizer_name", "tiny", "--max-turns", "1000000"]
        url = pair.start(mode, "atropos", args)
        limits = {"max_turns": 10**6, "max_tokens": 10**9}
        r = httpx.post(url + "/sessions", json={"limits": limits}, timeout=30)
        _ok(r)
        keys[url] = r.json()["api_key"]

    def chat(c: httpx.Client) -> None:
        key = keys[str(c.base_url).rstrip("/")]
        _ok(c.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}))

    return [
        Case("proxy", "GET /v1/models", lambda c: _ok(c.get("/v1/models"))),
        Case("proxy", "POST /v1/chat/completions (over fake)", chat),
    ]


def fake_setup(pair: Pair) -> list[Case]:
    for mode in MODES:
        pair.start(mode, "atropos.testing.fake_server", ["--port", "{port}"])
    body = {"model": "atropos-tiny", "prompt": "hi", "max_tokens": 4}
    return [
        Case("fake", "POST /v1/completions", lambda c: _ok(c.post("/v1/completions", json=body)))
    ]


SETUPS = {"api": api_setup, "local": local_setup, "proxy": proxy_setup, "fake": fake_setup}


# ----- measuring ------------------------------------------------------------------------------


def measure(pair: Pair, case: Case, mode: str, clients: dict[str, httpx.Client], n: int) -> float:
    """µs of server CPU per request over `n` requests."""
    client, pid = clients[mode], pair.pid(mode)
    before = cpu_seconds(pid)
    for _ in range(n):
        case.send(client)
    return (cpu_seconds(pid) - before) / n * 1e6


def run_case(pair: Pair, case: Case, requests: int, rounds: int) -> dict[str, Any]:
    n = max(int(requests * case.share), 20)
    clients = {m: httpx.Client(base_url=pair.urls[m], timeout=120) for m in MODES}
    try:
        for mode in MODES:  # warm-up
            for _ in range(max(n // 10, 5)):
                case.send(clients[mode])
        per: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                per[mode].append(measure(pair, case, mode, clients, n))
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
        "off_us": per["off"], "diff_us": diffs,
    }  # fmt: skip


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| server | ordinary request | requests/round | rules on, µs CPU/request | rules off |"
        " on - off, µs | on - off, % | rules in path |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        off = statistics.median(r["off_us"])
        diff = statistics.median(r["diff_us"])
        share = f"{diff / off * 100:+.1f}%" if off else "-"
        lines.append(
            f"| {r['server']} | {r['case']} | {r['requests']} | {_cell(r['on_us'])} |"
            f" {_cell(r['off_us'])} | {diff:+.1f} ({min(r['diff_us']):+.0f} to"
            f" {max(r['diff_us']):+.0f}) | {share} | {'yes' if r['bypassed'] else 'no'} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def started(tmp: Path, name: str) -> Iterator[tuple[Pair, list[Case]]]:
    pair = Pair(tmp, name)
    try:
        yield pair, SETUPS[name](pair)
    finally:
        pair.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per case and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (on and off each, alternating)")
    p.add_argument("--only", help=f"comma-separated servers of {', '.join(SERVERS)}")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    only = args.only.split(",") if args.only else list(SERVERS)
    if set(only) - set(SERVERS):
        p.error(f"unknown servers: {sorted(set(only) - set(SERVERS))}")
    results: list[dict[str, Any]] = []
    start = time.monotonic()
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
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"machine": machine(), "code": code_version(), "results": results}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
