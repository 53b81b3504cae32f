#!/usr/bin/env python3
"""`make bench-smoke`: CPU per unit of each hot path against a committed baseline.

Each path is measured in CPU time, never wall time, a few seconds each, the same way the
baseline (`benchmarks/smoke_baseline.json`, with the machine and load it was recorded on) was:

* `api_ingest_us_per_group`: the API app (SQLite store, default config) answering `POST
  /scored_data` of BaseEnv-shaped groups (8 x 512 tokens, gzipped), called as ASGI in this
  process (no socket: the HTTP parser is uvicorn's, not ours); `time.process_time`.
* `api_batch_us_per_batch`: the same app answering `GET /batch` (64 sequences) from what was
  posted.
* `api_batch_20k_over_1k`: `GET /batch` CPU with 20,000 groups queued over that with 1,000
  (small groups, `--max-staleness` on): batch assembly must cost in proportion to the batch,
  not the queue (~1).
* `packer_us_per_batch`: `packer.pick_batch` over 1,000 groups of mixed sizes (the subset-sum
  path: greedy first-fit cannot land on 64).
* `sender_encode_us_per_group` and `sender_msgpack_us_per_group`: what the env's sender does to
  a batch of groups before it posts it: `wire.encode_plain` and gzip level 1 (an API not ours,
  or not on this machine), or msgpack (our API on this machine).
* `proxy_us_per_request`: the rollout proxy process (`atropos proxy serve`) over the fake
  inference server, 32 sessions x 8 turns: its CPU (/proc) per chat request, driven as
  `benchmarks/proxy_overhead.py` drives it.
* `env_us_per_rollout`: the env runtime process against the fake server,
  `benchmarks/env_throughput.py --only ours --modes process --workers 64` over a 3 s window:
  its CPU (/proc) per rollout.

A path fails when it costs more than `LIMIT` (2x) its baseline. A loaded machine inflates CPU
time a little, never 2x, but a single run can be unlucky: a path over the limit is measured
again, up to `TRIES` times, and its least figure counts. Figures are CPU of one process, so
other work on the machine slows the run but moves them little.

A slower machine is not a regression. The machines these runs land on differ: one measured
every path 1.2-1.9x the figures of another, idle both (RESULTS.md, issue 38 item 1, template
skeletons). So the baseline keeps the CPU of a fixed piece of reference work
(`calibrate`: Python objects, JSON, msgpack, gzip) measured with its figures, the check measures
it again, and where it costs more now (a slower machine) the limit grows by that factor:
`LIMIT * max(1, now / then)`. It never shrinks: on a faster machine the figures fall short of
the baseline by themselves, by different factors per path, and a tighter limit would fail the
paths that gain the least from the faster machine.

    python benchmarks/smoke.py                  # check every path (exit 1 on a regression)
    python benchmarks/smoke.py --only api_ingest_us_per_group
    python benchmarks/smoke.py --record         # re-measure and write the baseline

When a slowdown is intended (a path does more on purpose), re-record with `make
bench-smoke-record` on an otherwise idle machine and commit `benchmarks/smoke_baseline.json`
with the change that causes it, saying why in the commit message.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the helpers beside us

from api_throughput import Workload, make_group  # noqa: E402
from procstat import code_version, cpu_seconds, free_port, machine  # noqa: E402

from atropos import wire  # noqa: E402
from atropos.api import ApiConfig, create_app  # noqa: E402
from atropos.api.packer import Item, pick_batch  # noqa: E402

BASELINE = ROOT / "benchmarks" / "smoke_baseline.json"
LIMIT = 2.0  # a path fails past this many times its baseline
TRIES = 3  # measurements of a path over the limit before it fails
W = Workload(group_size=8, seq_len=512, batch_size=64)


# ----- the API, called as ASGI in this process -----------------------------------------------


async def asgi(app: Any, method: str, path: str, body: bytes = b"", gz: bool = False) -> bytes:
    """One request to an ASGI app without a socket; the response body (raises unless 200)."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-length", b"%d" % len(body))]
    if body:
        headers.append((b"content-type", b"application/json"))
    if gz:
        headers.append((b"content-encoding", b"gzip"))
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    status: list[int] = []
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"{method} {path}: HTTP {status}: {b''.join(chunks)[:300]!r}")
    return b"".join(chunks)


async def started_app(tmp: Path, batch_size: int, max_staleness: int | None = None) -> Any:
    """The API app on a fresh SQLite store, a trainer registered and started, one env."""
    app = create_app(ApiConfig(store=f"sqlite:{tmp / 'api.db'}", max_staleness=max_staleness))
    reg = {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": batch_size,
        "max_token_len": W.seq_len,
        "checkpoint_dir": "c",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": 10**6,
    }
    await asgi(app, "POST", "/register", wire.encode(reg))
    await asgi(app, "GET", "/batch")
    env = {"max_token_length": W.seq_len, "desired_name": "e", "weight": 1.0, "group_size": 8}
    await asgi(app, "POST", "/register-env", wire.encode(env))
    return app


def api_bodies(n: int) -> list[bytes]:
    """`n` BaseEnv-shaped groups, JSON as BaseEnv writes it, gzipped (level 1: the smoke's
    setup stays short; the server's work does not depend on the level)."""
    out = []
    for i in range(n):
        group = make_group(W, i)
        group["env_id"] = 0
        out.append(gzip.compress(json.dumps(group).encode(), 1, mtime=0))
    return out


def measure_api(groups: int = 160) -> dict[str, float]:
    """`api_ingest_us_per_group` and `api_batch_us_per_batch` (one app, one run)."""
    bodies = api_bodies(groups)

    async def run(tmp: Path) -> dict[str, float]:
        app = await started_app(tmp, W.batch_size)
        t0 = time.process_time()
        for body in bodies:
            await asgi(app, "POST", "/scored_data", body, gz=True)
        t1 = time.process_time()
        batches = groups * W.group_size // W.batch_size
        for _ in range(batches):
            if b'"batch":null' in await asgi(app, "GET", "/batch"):
                raise RuntimeError("GET /batch: no batch although groups are queued")
        t2 = time.process_time()
        app.state.hub.store.close()
        return {
            "api_ingest_us_per_group": (t1 - t0) / groups * 1e6,
            "api_batch_us_per_batch": (t2 - t1) / batches * 1e6,
        }

    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        return asyncio.run(run(Path(tmp)))


def batch_cpu_at_depth(depth: int, batches: int = 40) -> float:
    """CPU seconds per `GET /batch` (8 groups of 8 small sequences) with `depth` groups queued
    (filled through the hub in one call, to keep the setup short), under `--max-staleness`
    (set out of reach: nothing is dropped, but staleness is checked at every batch)."""
    group = wire.Group(
        tokens=[[1, 2, 3, 4]] * 8, masks=[[-100, 2, 3, 4]] * 8, scores=[0.5] * 8, policy_version=0
    )

    async def run(tmp: Path) -> float:
        app = await started_app(tmp, 64, max_staleness=10**6)
        hub = app.state.hub
        hub.ingest([group] * (depth + batches * 8))
        t0 = time.process_time()
        for _ in range(batches):
            await asgi(app, "GET", "/batch")
        used = time.process_time() - t0
        hub.store.close()
        return used / batches

    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        return asyncio.run(run(Path(tmp)))


def measure_depth() -> dict[str, float]:
    """`api_batch_20k_over_1k`: batch CPU is flat in the queue's depth (about 1)."""
    return {"api_batch_20k_over_1k": batch_cpu_at_depth(20_000) / batch_cpu_at_depth(1_000)}


# ----- pure functions: the packer and the sender's encoding ----------------------------------


def measure_packer(calls: int = 20) -> dict[str, float]:
    """`packer_us_per_batch`: sizes 5, 7 and 9 in turn (1,000 groups), batches of 64: greedy
    first-fit overshoots, so the subset-sum pass runs."""
    items = [Item((5, 7, 9)[i % 3], i % 4) for i in range(1000)]
    if pick_batch(items, 64) is None:
        raise RuntimeError("packer: no batch of 64 from sizes 5, 7 and 9")
    t0 = time.process_time()
    for _ in range(calls):
        pick_batch(items, 64)
    return {"packer_us_per_batch": (time.process_time() - t0) / calls * 1e6}


def measure_sender(groups: int = 64) -> dict[str, float]:
    """What `envs.runner.sender` does to a batch of 8 groups before it posts it:
    `sender_encode_us_per_group`, `wire.encode_plain` and gzip level 1 (ISA-L when installed),
    its body to an API that is not ours or not on this machine; `sender_msgpack_us_per_group`,
    msgpack with no gzip, its body to our API on this machine."""
    try:
        from isal import igzip as compressor
    except ImportError:  # pragma: no cover
        compressor = gzip  # type: ignore[assignment]
    batch = [make_group(W, i) for i in range(groups)]
    t0 = time.process_time()
    for start in range(0, groups, 8):
        compressor.compress(wire.encode_plain(batch[start : start + 8]), 1)
    t1 = time.process_time()
    packed = msgspec.msgpack.Encoder().encode
    for start in range(0, groups, 8):
        packed(batch[start : start + 8])
    t2 = time.process_time()
    return {
        "sender_encode_us_per_group": (t1 - t0) / groups * 1e6,
        "sender_msgpack_us_per_group": (t2 - t1) / groups * 1e6,
    }


# ----- processes: the rollout proxy and the env runtime, over the fake server ----------------


def measure_proxy(sessions: int = 32, turns: int = 8) -> dict[str, float]:
    """`proxy_us_per_request`: the proxy process's CPU per chat request (/proc), after a
    warm-up, driven by `proxy_overhead.drive`."""
    from proxy_overhead import drive, proxy_command, start, stop

    from atropos.demo.procs import wait_until_up

    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as name:
        tmp = Path(name)
        port = free_port()
        fake_argv = [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port)]
        fake_proc = start(fake_argv, tmp / "fake.log")
        proxy_proc = None
        try:
            fake = f"http://127.0.0.1:{port}/v1"
            proxy_port = free_port()  # both start at once: the proxy calls the server later
            proxy_proc = start(proxy_command("ours", proxy_port, fake, tmp), tmp / "proxy.log")
            base = f"http://127.0.0.1:{proxy_port}"
            wait_until_up(f"{fake}/models", deadline=120)
            wait_until_up(f"{base}/health", deadline=120)
            asyncio.run(drive("ours", base, 8, 2))  # imports, template, pools
            pid = proxy_proc.pid
            done = asyncio.run(drive("ours", base, sessions, turns, lambda: cpu_seconds(pid)))
        finally:
            if proxy_proc is not None:
                stop(proxy_proc)
            stop(fake_proc)
    return {"proxy_us_per_request": done["cpu_s"] / done["requests"] * 1e6}


def measure_env() -> dict[str, float]:
    """`env_us_per_rollout`: `benchmarks/env_throughput.py`'s own figure (the env process's
    CPU per rollout over its window), on a short process-mode run."""
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as name:
        out = Path(name) / "env.json"
        argv = [
            sys.executable, str(ROOT / "benchmarks" / "env_throughput.py"), "--only", "ours",
            "--modes", "process", "--workers", "64", "--warmup", "1", "--duration", "3",
            "--quiet-wait", "0", "--json", str(out),
        ]  # fmt: skip
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"env_throughput.py failed:\n{done.stdout[-2000:]}{done.stderr}")
        run = json.loads(out.read_text())["runs"][0]
    return {"env_us_per_rollout": float(run["env_cpu_us_per_rollout"])}


MEASURES: dict[str, Callable[[], dict[str, float]]] = {
    "api": measure_api,
    "api_depth": measure_depth,
    "packer": measure_packer,
    "sender": measure_sender,
    "proxy": measure_proxy,
    "env": measure_env,
}
UNITS = {
    "api_ingest_us_per_group": "us CPU per group (8 x 512 tokens)",
    "api_batch_us_per_batch": "us CPU per batch (64 sequences)",
    "api_batch_20k_over_1k": "ratio of /batch CPU at 20k queued groups to 1k",
    "packer_us_per_batch": "us CPU per batch (subset-sum path)",
    "sender_encode_us_per_group": "us CPU per group (JSON, gzip)",
    "sender_msgpack_us_per_group": "us CPU per group (msgpack, to our API on loopback)",
    "proxy_us_per_request": "us CPU of the proxy per request",
    "env_us_per_rollout": "us CPU of the env per rollout",
}


# ----- check and record ----------------------------------------------------------------------


def calibrate() -> float:
    """CPU us of a fixed piece of reference work (the least of 9 runs): what this machine's
    speed is, for the kinds of work the paths do."""
    rows = [{"id": i, "text": f"token {i} " * 4, "ids": list(range(i % 64))} for i in range(400)]
    best = float("inf")
    for _ in range(9):
        t0 = time.process_time()
        for _ in range(5):
            doc = json.dumps(rows)
            json.loads(doc)
            msgspec.msgpack.decode(msgspec.msgpack.encode(rows))
            gzip.compress(doc.encode(), 1)
            sorted(rows, key=lambda r: (len(r["ids"]), r["text"]))
        best = min(best, time.process_time() - t0)
    return best * 1e6


def measure(
    groups: list[str], baseline: dict[str, float], limit: float = LIMIT
) -> dict[str, float]:
    """Every figure of `groups`; a group with a figure over `limit` x its baseline is measured
    again, up to `TRIES` times in all, and each figure keeps its least value."""
    found: dict[str, float] = {}
    for group in groups:
        for attempt in range(TRIES):
            t0 = time.perf_counter()
            for name, value in MEASURES[group]().items():
                found[name] = min(value, found.get(name, value))
            took = time.perf_counter() - t0
            print(f"bench-smoke: {group}: {took:.1f} s (try {attempt + 1})", flush=True)
            over = [n for n in found if n in baseline and found[n] > limit * baseline[n]]
            if not over:
                break
    return found


def load_baseline(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SystemExit(f"bench-smoke: no baseline at {path}; record one with --record")
    return json.loads(path.read_text())


def record(path: Path, found: dict[str, float]) -> None:
    """Write the baseline: the figures, their units, and what they were measured on (the
    figures of paths not measured now are kept)."""
    before = json.loads(path.read_text()) if path.exists() else {}
    kept = before.get("figures", {})
    measured = sorted(found)
    found = {**{n: v for n, v in kept.items() if n in UNITS}, **found}
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    # each figure's own conditions: when, under which load and at which commit it was measured
    sources = {n: v for n, v in before.get("measured", {}).items() if n in found}
    now = {"at": when, "load_average_before": os.getloadavg(), "commit": code_version()["commit"]}
    sources |= {n: now for n in measured}
    doc = {
        "note": "CPU per unit of each hot path (benchmarks/smoke.py); `make bench-smoke` fails"
        f" past {LIMIT:g}x these. Re-record with `make bench-smoke-record` on an idle machine.",
        "recorded": when,
        "machine": machine(),
        "load_average_before": os.getloadavg(),
        "code": code_version(),
        "units": {n: UNITS[n] for n in found},
        "figures": {n: round(v, 3) for n, v in found.items()},
        "measured": sources,
        "calibration_us": round(calibrate(), 1),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"bench-smoke: wrote {path}")


def verdicts(
    found: dict[str, float], baseline: dict[str, float], limit: float = LIMIT
) -> list[str]:
    """One line per figure; the failures start with FAIL and say what to do."""
    lines = []
    for name, value in found.items():
        base = baseline.get(name)
        if base is None:
            lines.append(f"  new  {name}: {value:.1f} ({UNITS[name]}); not in the baseline")
            continue
        ratio = value / base if base else float("inf")
        word = "FAIL" if ratio > limit else "ok  "
        lines.append(
            f"  {word} {name}: {value:.1f} against the baseline {base:.1f} (x{ratio:.2f},"
            f" limit x{limit:.2f}; {UNITS[name]})"
        )
    return lines


def machine_limit(then: float | None) -> float:
    """`LIMIT`, grown by how much more the reference work costs on this machine than on the
    baseline's (`then`, its CPU us; a baseline without it: `LIMIT`)."""
    if not then:
        return LIMIT
    now = calibrate()
    speed = now / then
    print(
        f"bench-smoke: the reference work costs {now:.0f} us here, {then:.0f} on the baseline's"
        f" machine (x{speed:.2f}): limit x{LIMIT * max(1.0, speed):.2f}",
        flush=True,
    )
    return LIMIT * max(1.0, speed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="measure and write the baseline")
    p.add_argument("--only", nargs="+", choices=list(MEASURES), help="measure these groups")
    p.add_argument("--baseline", type=Path, default=BASELINE, help="the baseline file")
    args = p.parse_args(argv)
    load = os.getloadavg()
    print(f"bench-smoke: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    groups = args.only or list(MEASURES)
    if args.record:
        record(args.baseline, measure(groups, {}))
        return 0
    recorded = load_baseline(args.baseline)
    baseline = recorded["figures"]
    limit = machine_limit(recorded.get("calibration_us"))
    found = measure(groups, baseline, limit)
    lines = verdicts(found, baseline, limit)
    print("\n".join(lines))
    if any(line.lstrip().startswith("FAIL") for line in lines):
        print(
            f"bench-smoke: a hot path costs more than {limit:.2f}x its baseline (the least of"
            f" {TRIES} measurements). If the slowdown is intended, re-record on an idle machine:"
            f" `make bench-smoke-record` (python benchmarks/smoke.py --record), and commit"
            f" {args.baseline.relative_to(ROOT)} with the change, saying why."
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
