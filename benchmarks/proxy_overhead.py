"""What the rollout proxy costs: CPU per request of the proxy process, against calling the
inference server directly, at 256 (or 4,096) concurrent sessions of 16 calls; upstream
atroposlib 0.4.0's ManagedServerProxy and our proxy at an earlier revision (`--old-rev`, run
from a `git worktree` of it) on the same load, side by side.

    python benchmarks/proxy_overhead.py --rounds 5 --sessions 256 --turns 16
    python benchmarks/proxy_overhead.py --rounds 1 --sessions 4096 --only ours --only before \
        --old-rev 9675a18
    python benchmarks/proxy_overhead.py --rounds 2 --sessions 32 --turns 16 --context 32000 \
        --only floor --only ours --only before --old-rev 0417e07   # long prompts

Each round, for each of `direct`, `ours` and `upstream` (one after the other, on the same
machine, against the same fake inference server process: `atropos.testing.fake_server`, random
3-20 token answers):

- `sessions` agents run at once, each a conversation of `turns` chat calls (the history grows by
  the reply and a new user message each turn), sent with one shared `httpx.AsyncClient`;
- `direct`: the calls go to the fake server's `/v1/chat/completions` (it renders the template
  itself); `floor`: through `benchmarks/proxy_floor.py`, which forwards each chat body to the
  server as it came (the same uvicorn, HTTP rules, msgspec decode and inference HTTP client as
  the proxy, none of its work: what any proxy in front of the server costs); `ours`: `atropos
  proxy serve`, a session each (`POST /sessions`, then `/s/ID/v1/chat/completions` with its
  key); `upstream`: `python -m
  atroposlib.envs.server_handling.managed_server_proxy` (`POST /sessions/create`, then
  `/UUID/v1/chat/completions`), from the venv of `scripts/upstream_venv.py full`.

Measured, while the conversations run (the sessions are opened before), over their chat
requests, in ms per request: the proxy process's CPU (utime+stime from /proc, its whole tree;
`direct` has none), the fake server's CPU (a proxy sends it token ids, so it renders no
template: it works less than when called directly), and so the whole path's CPU over calling
directly, `net_cpu_ms_over_direct` = proxy + server - direct's server; the wall time and the
requests' median and largest latency (a stall shows there), the proxy's resident memory
per session (its growth from before the sessions to the end, over the sessions), and how many
requests were sent again because the kept-alive connection they went out on was closed before
they were read (`retries`). Prints a table (median, then min-max over rounds) and writes
benchmarks/results/proxy_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_context import context_text  # noqa: E402
from procstat import code_version, cpu_seconds, machine, upstream_python, wait_quiet  # noqa: E402

from atropos.demo.procs import wait_until_up  # noqa: E402
from atropos.inference.tokenizer import load_tokenizer  # noqa: E402
from atropos.testing import free_port, tiny_tokenizer_path  # noqa: E402

TOK = load_tokenizer("tiny")

MODES = ("direct", "floor", "ours", "before", "upstream")
RETRIED = (httpx.ReadError, httpx.RemoteProtocolError)  # a kept-alive connection closed under us


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def start_fake(port: int, context: int, turns: int, tmp: Path) -> subprocess.Popen[bytes]:
    """The fake inference server, its context room for `context` tokens and `turns` calls."""
    room = str(4096 + context + 64 * turns)
    argv = [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port)]
    return start([*argv, "--max-model-len", room], tmp / "fake.log")


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` (VmRSS from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def old_tree(rev: str, tmp: Path) -> Path:
    """A `git worktree` of `rev` (the proxy before a change), removed by `drop_tree`."""
    path = tmp / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True
    )
    return path


def drop_tree(path: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def proxy_command(mode: str, port: int, fake: str, tmp: Path) -> list[str]:
    if mode == "floor":
        floor = str(ROOT / "benchmarks" / "proxy_floor.py")
        return [sys.executable, floor, "--port", str(port), "--server", fake]
    if mode in ("ours", "before"):
        return [
            sys.executable, "-m", "atropos", "proxy", "serve", "--port", str(port),
            "--openai.base_url", fake, "--openai.server_type", "vllm",
            "--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny",
            "--max-sessions", "100000",
        ]  # fmt: skip
    config = tmp / "servers.json"
    config.write_text(
        json.dumps(
            {
                "model_name": "atropos-tiny",
                "tokenizer_name": str(tiny_tokenizer_path()),
                "servers": [{"base_url": fake, "server_type": "vllm", "api_key": "unused"}],
            }
        )
    )
    return [
        upstream_python("full"), "-m", "atroposlib.envs.server_handling.managed_server_proxy",
        "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


async def drive(
    mode: str,
    base: str,
    sessions: int,
    turns: int,
    cpu: Any = lambda: 0.0,
    rss: Any = lambda: 0,
    context: str = "",
) -> dict[str, Any]:
    """Open the sessions, then run the agents; return wall seconds, requests, their latencies,
    `cpu()`'s growth over the conversations (sessions already open), `rss()` before the
    sessions, once they are open and at the end, and how many requests were sent again after
    the connection they went out on was found closed (`RETRIED`: never answered)."""
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    latencies: list[float] = []
    retries = [0]
    rss0 = rss()
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def session_url(i: int) -> tuple[str, dict[str, str]]:
            if mode == "direct":
                return f"{base}/v1/chat/completions", {}
            if mode in ("ours", "before", "floor"):
                made = (await client.post(f"{base}/sessions")).json()
                headers = {"authorization": f"Bearer {made['api_key']}"}
                return f"{base}/s/{made['id']}/v1/chat/completions", headers
            made = (await client.post(f"{base}/sessions/create", json={})).json()
            return f"{base}/{made['uuid']}/v1/chat/completions", {}

        async def agent(i: int, url: str, headers: dict[str, str]) -> None:
            task = f"task {i}: begin{context}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            for turn in range(turns):
                body = {"model": "atropos-tiny", "messages": messages, "max_tokens": 24}
                t0 = time.perf_counter()
                for attempt in range(3):
                    try:
                        answer = await client.post(url, json=body, headers=headers)
                        break
                    except RETRIED:
                        if attempt == 2:
                            raise
                        retries[0] += 1
                latencies.append(time.perf_counter() - t0)
                answer.raise_for_status()
                reply = answer.json()["choices"][0]["message"]
                messages += [
                    {"role": "assistant", "content": reply.get("content") or ""},
                    {"role": "user", "content": f"task {i}: step {turn + 1}"},
                ]

        urls = await asyncio.gather(*(session_url(i) for i in range(sessions)))
        rss1, cpu0, t0 = rss(), cpu(), time.perf_counter()
        await asyncio.gather(*(agent(i, u, h) for i, (u, h) in enumerate(urls)))
        wall, used = time.perf_counter() - t0, cpu() - cpu0
    return {
        "wall_s": wall,
        "requests": len(latencies),
        "latencies": latencies,
        "cpu_s": used,
        "retries": retries[0],
        "rss": [rss0, rss1, rss()],
    }


def one(mode: str, fake: str, fake_pid: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    proc = None
    base = fake.removesuffix("/v1")
    if mode != "direct":
        port = free_port()
        env = None
        if mode == "before":
            env = {**os.environ, "PYTHONPATH": str(args.before_tree / "src")}
        proc = start(proxy_command(mode, port, fake, tmp), tmp / f"{mode}.log", env)
        base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{base}/health", deadline=120)
    try:
        asyncio.run(drive(mode, base, 8, 2))  # warm up: imports, template compiled, pools
        wait_quiet(10)
        cpu = (lambda: cpu_seconds(proc.pid)) if proc else (lambda: 0.0)
        rss = (lambda: rss_bytes(proc.pid)) if proc else (lambda: 0)
        server0 = cpu_seconds(fake_pid)
        result = asyncio.run(
            drive(mode, base, args.sessions, args.turns, cpu, rss, context_text(TOK, args.context))
        )
        result["server_cpu_s"] = cpu_seconds(fake_pid) - server0
    finally:
        if proc is not None:
            stop(proc)
    lat = sorted(result.pop("latencies"))
    rss0, rss1, rss2 = result["rss"]
    return {
        **result,
        "kib_per_session": (rss2 - rss0) / 1024 / args.sessions,
        "latency_max_ms": 1000 * lat[-1],
        "proxy_cpu_ms_per_request": 1000 * result["cpu_s"] / result["requests"],
        "server_cpu_ms_per_request": 1000 * result["server_cpu_s"] / result["requests"],
        "latency_p50_ms": 1000 * lat[len(lat) // 2],
        "requests_per_s": result["requests"] / result["wall_s"],
    }


def table(rounds: list[dict[str, dict[str, Any]]], modes: list[str]) -> str:
    for found in rounds:  # what the path costs in all, proxy and server, over calling directly
        direct = found.get("direct", {}).get("server_cpu_ms_per_request")
        for row in found.values():
            if direct is not None:
                spent = row["proxy_cpu_ms_per_request"] + row["server_cpu_ms_per_request"]
                row["net_cpu_ms_over_direct"] = spent - direct
    keys = ["proxy_cpu_ms_per_request", "server_cpu_ms_per_request"]
    keys += ["net_cpu_ms_over_direct"] if "direct" in modes else []
    keys += ["latency_p50_ms", "latency_max_ms", "requests_per_s", "kib_per_session"]
    rows = ["| mode | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for mode in modes:
        cells = []
        for key in keys:
            values = [r[mode][key] for r in rounds]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument(
        "--old-rev", help="also run the proxy of this git revision (mode `before`, a worktree)"
    )
    parser.add_argument(
        "--context",
        type=int,
        default=0,
        help="about this many tokens of text in each agent's first message (a long prompt)",
    )
    parser.add_argument("--only", choices=MODES, action="append", help="modes to run")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/proxy_overhead.json"))
    args = parser.parse_args()
    modes = args.only or [m for m in MODES if m != "before" or args.old_rev]
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        args.before_tree = old_tree(args.old_rev, tmp) if "before" in modes else None
        port = free_port()
        fake_proc = start_fake(port, args.context, args.turns, tmp)
        fake = f"http://127.0.0.1:{port}/v1"
        try:
            wait_until_up(f"{fake}/models", deadline=60)
            for r in range(args.rounds):
                found = {}
                for mode in modes:
                    found[mode] = one(mode, fake, fake_proc.pid, args, tmp)
                    print(f"round {r + 1}/{args.rounds} {mode}: {found[mode]}", flush=True)
                rounds.append(found)
        finally:
            stop(fake_proc)
            if args.before_tree is not None:
                drop_tree(args.before_tree)
    print(table(rounds, modes))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    args.before_tree = str(args.before_tree)
    doc = {"args": vars(args), "machine": machine(), "code": code_version(), "rounds": rounds}
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
