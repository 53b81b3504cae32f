"""What the rollout proxy costs: CPU per request of the proxy process, against calling the
inference server directly, at 256 concurrent sessions; upstream atroposlib 0.4.0's
ManagedServerProxy on the same load, side by side.

    python benchmarks/proxy_overhead.py --rounds 5 --sessions 256 --turns 4

Each round, for each of `direct`, `ours` and `upstream` (one after the other, on the same
machine, against the same fake inference server process: `atropos.testing.fake_server`, random
3-20 token answers):

- `sessions` agents run at once, each a conversation of `turns` chat calls (the history grows by
  the reply and a new user message each turn), sent with one shared `httpx.AsyncClient`;
- `direct`: the calls go to the fake server's `/v1/chat/completions` (it renders the template
  itself); `ours`: `atropos proxy serve`, a session each (`POST /sessions`, then
  `/s/ID/v1/chat/completions` with its key); `upstream`: `python -m
  atroposlib.envs.server_handling.managed_server_proxy` (`POST /sessions/create`, then
  `/UUID/v1/chat/completions`), from the venv of `scripts/upstream_venv.py full`.

Measured, while the conversations run (the sessions are opened before), over their chat
requests, in ms per request: the proxy process's CPU (utime+stime from /proc, its whole tree;
`direct` has none), the fake server's CPU (a proxy sends it token ids, so it renders no
template: it works less than when called directly), and so the whole path's CPU over calling
directly, `net_cpu_ms_over_direct` = proxy + server - direct's server; the wall time and the
requests' median latency. Prints a table (median, then min-max over rounds) and writes
benchmarks/results/proxy_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from procstat import code_version, cpu_seconds, machine, upstream_python, wait_quiet  # noqa: E402

from atropos.demo.procs import wait_until_up  # noqa: E402
from atropos.testing import free_port, tiny_tokenizer_path  # noqa: E402

MODES = ("direct", "ours", "upstream")


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def proxy_command(mode: str, port: int, fake: str, tmp: Path) -> list[str]:
    if mode == "ours":
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
    mode: str, base: str, sessions: int, turns: int, cpu: Any = lambda: 0.0
) -> dict[str, Any]:
    """Open the sessions, then run the agents; return wall seconds, requests, their latencies
    and `cpu()`'s growth over the conversations (sessions already open)."""
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def session_url(i: int) -> tuple[str, dict[str, str]]:
            if mode == "direct":
                return f"{base}/v1/chat/completions", {}
            if mode == "ours":
                made = (await client.post(f"{base}/sessions")).json()
                headers = {"authorization": f"Bearer {made['api_key']}"}
                return f"{base}/s/{made['id']}/v1/chat/completions", headers
            made = (await client.post(f"{base}/sessions/create", json={})).json()
            return f"{base}/{made['uuid']}/v1/chat/completions", {}

        async def agent(i: int, url: str, headers: dict[str, str]) -> None:
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}: begin"}]
            for turn in range(turns):
                body = {"model": "atropos-tiny", "messages": messages, "max_tokens": 24}
                t0 = time.perf_counter()
                answer = await client.post(url, json=body, headers=headers)
                latencies.append(time.perf_counter() - t0)
                answer.raise_for_status()
                reply = answer.json()["choices"][0]["message"]
                messages += [
                    {"role": "assistant", "content": reply.get("content") or ""},
                    {"role": "user", "content": f"task {i}: step {turn + 1}"},
                ]

        urls = await asyncio.gather(*(session_url(i) for i in range(sessions)))
        cpu0, t0 = cpu(), time.perf_counter()
        await asyncio.gather(*(agent(i, u, h) for i, (u, h) in enumerate(urls)))
        wall, used = time.perf_counter() - t0, cpu() - cpu0
    return {"wall_s": wall, "requests": len(latencies), "latencies": latencies, "cpu_s": used}


def one(mode: str, fake: str, fake_pid: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    proc = None
    base = fake.removesuffix("/v1")
    if mode != "direct":
        port = free_port()
        proc = start(proxy_command(mode, port, fake, tmp), tmp / f"{mode}.log")
        base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{base}/health", deadline=120)
    try:
        asyncio.run(drive(mode, base, 8, 2))  # warm up: imports, template compiled, pools
        wait_quiet(10)
        cpu = (lambda: cpu_seconds(proc.pid)) if proc else (lambda: 0.0)
        server0 = cpu_seconds(fake_pid)
        result = asyncio.run(drive(mode, base, args.sessions, args.turns, cpu))
        result["server_cpu_s"] = cpu_seconds(fake_pid) - server0
    finally:
        if proc is not None:
            stop(proc)
    lat = sorted(result.pop("latencies"))
    return {
        **result,
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
    keys += ["latency_p50_ms", "requests_per_s"]
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
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--only", choices=MODES, action="append", help="modes to run")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/proxy_overhead.json"))
    args = parser.parse_args()
    modes = args.only or list(MODES)
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port = free_port()
        fake_proc = start(
            [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port)],
            tmp / "fake.log",
        )
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
    print(table(rounds, modes))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args), "machine": machine(), "code": code_version(), "rounds": rounds}
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
