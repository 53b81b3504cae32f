#!/usr/bin/env python3
"""Trajectory API throughput: our server against upstream atroposlib 0.4.0, side by side.

The workload is a realistic RL run squeezed in time. `--envs` environment clients post
`--groups` scored groups (each `--group-size` sequences of `--seq-len` tokens: a ~128-token
prompt masked with -100, the rest trained, plus `inference_logprobs` rows, as atroposlib's
BaseEnv sends them: `json.dumps`, then gzip with `Content-Encoding: gzip`) over `--connections`
connections in total, while one trainer drains `GET /batch` until every group came back in
batches of exactly `--batch-size` sequences. Every body is encoded and gzipped before any clock
starts, and this client runs in its own process; each server is a fresh subprocess with a fresh
store and port, bound to 127.0.0.1.

Two phases per server, each on a fresh server:

* streaming: posting and draining run together; we time first post -> last group drained, the
  trainer's `/batch` latencies, and the server's own CPU time (utime+stime of its process tree
  from /proc) over the phase;
* queued: all groups are posted first, then the trainer drains them back to back; we time each
  `/batch` (the p99 target is for this phase) and read the server's memory with the whole
  workload queued.

Resident memory is VmHWM (peak) and VmRSS from /proc/PID/status. Ratios are ours/upstream.

Usage:
    .venv/bin/python benchmarks/api_throughput.py --json runs/api_throughput.json
    .venv/bin/python benchmarks/api_throughput.py --only ours --store memory --groups 200
    .venv/bin/python benchmarks/api_throughput.py --only ours --ours-arg=--response-gzip=always

Needs aiohttp (dev extra). Upstream runs from the separate venv made by
`scripts/upstream_venv.py light`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gzip
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers beside us
from procstat import (  # noqa: E402
    code_version,
    cpu_seconds,
    free_port,
    machine,
    machine_busy_seconds,
    process_tree,
    wait_quiet,
)
from procstat import upstream_python as _upstream_python  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ("ours", "upstream")
PROFILE_DIR: Path | None = None  # `--profile`: run our servers under cProfile, write here
NULL_TARGET = 3.0  # ours' server CPU per group <= 3x the null server's (issue 38, item 3)
GZIP_MIN = 1024  # atroposlib's BaseEnv gzips bodies of at least this many bytes
VOCAB = 151_000  # a Qwen-sized vocabulary


# ----- workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What the clients send and drain."""

    groups: int = 2000
    group_size: int = 8
    seq_len: int = 512
    batch_size: int = 64
    connections: int = 32
    envs: int = 4
    prompt_len: int = 128  # mean; each group's prompt is 7/8 to 9/8 of it
    gzip_level: int = 9  # gzip.compress's default, which BaseEnv uses
    poll_interval: float = 0.01  # trainer's sleep after an empty /batch
    timeout: float = 900.0  # seconds any one phase may take
    seed: int = 0

    def check(self) -> None:
        """Refuse workloads that cannot drain exactly."""
        if min(self.groups, self.group_size, self.seq_len, self.batch_size, self.envs) < 1:
            raise SystemExit("groups, group-size, seq-len, batch-size and envs must be >= 1")
        if self.connections < self.envs:
            raise SystemExit("--connections must be at least --envs (one per env or more)")
        if (self.groups * self.group_size) % self.batch_size or self.batch_size % self.group_size:
            raise SystemExit(
                "groups * group-size must be a multiple of batch-size, and batch-size a multiple"
                " of group-size, so that every group drains in exact batches"
            )

    @property
    def sequences(self) -> int:
        return self.groups * self.group_size

    @property
    def batches(self) -> int:
        return self.sequences // self.batch_size

    def connections_of(self, env: int) -> int:
        """Connections of env `env`: the total split as evenly as possible."""
        share, extra = divmod(self.connections, self.envs)
        return share + (1 if env < extra else 0)


def _float32(x: float) -> float:
    """Round to the nearest float32, as logprobs from an inference server are."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def make_group(w: Workload, index: int) -> dict[str, Any]:
    """Group `index` as BaseEnv sends it: one shared prompt, G sampled completions."""
    rng = random.Random(w.seed * 1_000_003 + index)
    low, high = w.prompt_len * 7 // 8, w.prompt_len * 9 // 8
    prompt_len = min(max(rng.randint(low, high), 1), w.seq_len - 1) if w.seq_len > 1 else 0
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    tokens, masks, logprobs = [], [], []
    for _ in range(w.group_size):
        completion = [rng.randrange(VOCAB) for _ in range(w.seq_len - prompt_len)]
        tokens.append(prompt + completion)
        masks.append([-100] * prompt_len + completion)
        # 1.0 is upstream's sentinel at masked positions; sampled tokens get real logprobs.
        logprobs.append([1.0] * prompt_len + [_float32(-rng.expovariate(3.0)) for _ in completion])
    return {
        "tokens": tokens,
        "masks": masks,
        "scores": [rng.choice((1.0, -1.0)) for _ in range(w.group_size)],
        "advantages": None,
        "ref_logprobs": None,
        "messages": None,
        "generation_params": None,
        "inference_logprobs": logprobs,
        "group_overrides": None,
        "overrides": None,
        "images": None,
        "env_id": index % w.envs,  # envs register in order on a fresh server: ids 0..envs-1
    }


@dataclass(frozen=True)
class Body:
    """A pre-encoded POST /scored_data body."""

    data: bytes
    gzipped: bool
    raw_size: int


def encode_body(w: Workload, index: int) -> Body:
    """Encode group `index` the way BaseEnv does: json.dumps, gzip when that helps."""
    raw = json.dumps(make_group(w, index)).encode()
    if len(raw) >= GZIP_MIN:
        packed = gzip.compress(raw, compresslevel=w.gzip_level)
        if len(packed) < len(raw):
            return Body(packed, True, len(raw))
    return Body(raw, False, len(raw))


def _encode_range(w: Workload, start: int, stop: int) -> list[Body]:
    return [encode_body(w, i) for i in range(start, stop)]


def encode_bodies(w: Workload, workers: int = 1) -> list[Body]:
    """Every body of the workload, in group order (group i belongs to env i % envs)."""
    if workers <= 1 or w.groups < 64:
        return _encode_range(w, 0, w.groups)
    step = math.ceil(w.groups / (workers * 4))
    starts = list(range(0, w.groups, step))
    stops = [min(i + step, w.groups) for i in starts]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        parts = pool.map(_encode_range, [w] * len(starts), starts, stops)
        return [body for part in parts for body in part]


# ----- server process ------------------------------------------------------------------------


def memory_mib(pid: int) -> dict[str, float]:
    """VmHWM (peak resident) and VmRSS (resident now) of `pid`'s tree, in MiB."""
    out = {"VmHWM": 0.0, "VmRSS": 0.0}
    for p in process_tree(pid):
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key in out:
                out[key] += int(value.split()[0]) / 1024
    return out


class Server:
    """One API server subprocess on a fresh port (and, for ours, a fresh store)."""

    def __init__(
        self, kind: str, workdir: Path, store: str, python: str, extra: Sequence[str] = ()
    ) -> None:
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"{kind}-{self.port}.log"
        if kind == "ours":
            spec = f"sqlite:{workdir / f'api-{self.port}.db'}" if store == "sqlite" else "memory"
            self.argv = [python, "-m", "atropos", "api", "serve", "--store", spec]
        elif kind == "upstream":
            self.argv = [python, "-m", "atroposlib.cli.run_api"]
        elif kind == "null":
            self.argv = [python, str(ROOT / "benchmarks" / "api_null_server.py")]
        else:
            raise ValueError(f"unknown server {kind!r}")
        self.argv += [*extra, "--host", "127.0.0.1", "--port", str(self.port)]
        if PROFILE_DIR is not None and kind != "upstream":  # cProfile writes it at a clean exit
            out = PROFILE_DIR / f"{kind}-{self.port}.prof"
            self.argv[1:1] = [str(ROOT / "benchmarks" / "profiled.py"), str(out)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until `GET /` answers."""
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for us does not hit it mid-measurement
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} server exited at start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.kind} server not ready in {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate (then kill) the server; safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# ----- client --------------------------------------------------------------------------------


class _Sequences(msgspec.Struct):
    tokens: list[list[int]]


class _BatchDoc(msgspec.Struct):
    batch: list[_Sequences] | None = None


_batch_decoder = msgspec.json.Decoder(_BatchDoc)
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values).

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 4], 99)
    (2, 4)
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class PhaseResult:
    """What one phase measured. Times in seconds unless the name says ms; memory in MiB."""

    groups_posted: int = 0
    groups_drained: int = 0
    batches: int = 0
    empty_polls: int = 0
    wall_s: float = 0.0  # streaming: first post -> last drained; queued: the drain alone
    post_s: float = 0.0  # first post -> last post answered
    elapsed_s: float = 0.0  # the whole measured window (CPU times cover this)
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    other_cpu_s: float = 0.0  # CPU of everything else on the machine: noise in the timings
    batch_latencies_ms: list[float] = field(default_factory=list)
    rss_idle_mib: float = 0.0  # before the phase
    rss_queued_mib: float = 0.0  # queued phase: everything posted, nothing drained
    peak_rss_mib: float = 0.0  # VmHWM after the phase
    final_rss_mib: float = 0.0  # VmRSS after the phase

    def summary(self, groups: int) -> dict[str, float]:
        lat = self.batch_latencies_ms
        return {
            "server_cpu_s_per_1000_groups": self.server_cpu_s / groups * 1000,
            "wall_s": self.wall_s,
            "post_s": self.post_s,
            "groups_per_s": groups / self.wall_s if self.wall_s else 0.0,
            "batch_p50_ms": percentile(lat, 50),
            "batch_p99_ms": percentile(lat, 99),
            "batch_max_ms": max(lat, default=0.0),
            "peak_rss_mib": self.peak_rss_mib,
            "final_rss_mib": self.final_rss_mib,
            "rss_idle_mib": self.rss_idle_mib,
            "rss_queued_mib": self.rss_queued_mib,
            "client_cpu_s": self.client_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "empty_polls": float(self.empty_polls),
        }


@dataclass
class ServerResult:
    """Both phases of one server."""

    server: str
    command: list[str]
    streaming: PhaseResult
    queued: PhaseResult


Tick = Callable[[str, int], None]  # progress callback: ("post" | "drain", groups)


def _nothing(*args: object) -> None:
    pass


@dataclass
class Hooks:
    """Progress reporting of `measure_server` (all optional)."""

    log: Callable[[str], None] = _nothing  # a line of news
    phase: Callable[[str, str], None] = _nothing  # (server, phase) is about to start
    tick: Tick = _nothing  # ("post" | "drain", groups just done)


async def _check(resp: aiohttp.ClientResponse, what: str) -> bytes:
    data = await resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {data[:300]!r}")
    return data


async def prepare(url: str, w: Workload) -> None:
    """Register the trainer, start it (first GET /batch) and register the envs in order."""
    registration = {
        "wandb_group": "bench",
        "wandb_project": "api-throughput",
        "batch_size": w.batch_size,
        "max_token_len": w.seq_len,
        "checkpoint_dir": "checkpoints",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": w.batches,
    }
    async with aiohttp.ClientSession(url, timeout=REQUEST_TIMEOUT) as s:
        async with s.post("/register", json=registration) as resp:
            await _check(resp, "POST /register")
        async with s.get("/batch") as resp:
            if json.loads(await _check(resp, "GET /batch")).get("batch") is not None:
                raise RuntimeError("a fresh server returned a batch")
        for env in range(w.envs):
            doc = {
                "max_token_length": w.seq_len,
                "desired_name": f"bench_env{env}",
                "weight": 1.0,
                "group_size": w.group_size,
            }
            async with s.post("/register-env", json=doc) as resp:
                reply = json.loads(await _check(resp, "POST /register-env"))
            if reply.get("status") != "success" or reply.get("env_id") != env:
                raise RuntimeError(f"register-env {env}: unexpected reply {reply}")


async def post_all(url: str, w: Workload, bodies: Sequence[Body], tick: Tick) -> float:
    """Post every body: env e sends groups e, e+envs, ... over its share of the connections.

    Returns the perf_counter time at which the last post was answered.
    """

    async def worker(session: aiohttp.ClientSession, todo: Iterator[Body]) -> None:
        for body in todo:  # workers of one env share the iterator: each body is sent once
            headers = {"Content-Type": "application/json"}
            if body.gzipped:
                headers["Content-Encoding"] = "gzip"
            async with session.post("/scored_data", data=body.data, headers=headers) as resp:
                reply = await _check(resp, "POST /scored_data")
            if b"received" not in reply:
                raise RuntimeError(f"POST /scored_data: unexpected reply {reply[:200]!r}")
            tick("post", 1)

    sessions = [
        aiohttp.ClientSession(
            url,
            connector=aiohttp.TCPConnector(limit=w.connections_of(env)),
            timeout=REQUEST_TIMEOUT,
        )
        for env in range(w.envs)
    ]
    try:
        tasks = []
        for env, session in enumerate(sessions):
            todo = iter(bodies[env :: w.envs])
            tasks += [worker(session, todo) for _ in range(w.connections_of(env))]
        await asyncio.gather(*tasks)
        return time.perf_counter()
    finally:
        for session in sessions:
            await session.close()


async def drain(url: str, w: Workload, result: PhaseResult, tick: Tick) -> float:
    """Poll GET /batch until every sequence came back; return when the last one did."""
    wanted = w.sequences
    got = 0
    async with aiohttp.ClientSession(
        url, connector=aiohttp.TCPConnector(limit=1), timeout=REQUEST_TIMEOUT
    ) as s:
        while got < wanted:
            t0 = time.perf_counter()
            async with s.get("/batch") as resp:
                data = await _check(resp, "GET /batch")
            t1 = time.perf_counter()
            batch = _batch_decoder.decode(data).batch
            if not batch:
                result.empty_polls += 1
                await asyncio.sleep(w.poll_interval)
                continue
            size = sum(len(g.tokens) for g in batch)
            if size != w.batch_size:
                raise RuntimeError(f"GET /batch: {size} sequences, expected {w.batch_size}")
            result.batch_latencies_ms.append((t1 - t0) * 1000)
            result.batches += 1
            result.groups_drained += len(batch)
            got += size
            tick("drain", len(batch))
        return time.perf_counter()


async def streaming_phase(
    server: Server, w: Workload, bodies: Sequence[Body], tick: Tick
) -> PhaseResult:
    """Post and drain at once; time first post -> last group drained."""
    result = PhaseResult(rss_idle_mib=memory_mib(server.pid)["VmRSS"])
    cpu0, client0, busy0 = cpu_seconds(server.pid), time.process_time(), machine_busy_seconds()
    t0 = time.perf_counter()
    posted_at, drained_at = await asyncio.wait_for(
        asyncio.gather(post_all(server.url, w, bodies, tick), drain(server.url, w, result, tick)),
        w.timeout,
    )
    result.server_cpu_s = cpu_seconds(server.pid) - cpu0
    result.client_cpu_s = time.process_time() - client0
    result.other_cpu_s = machine_busy_seconds() - busy0 - result.server_cpu_s - result.client_cpu_s
    result.groups_posted = len(bodies)
    result.wall_s = result.elapsed_s = drained_at - t0
    result.post_s = posted_at - t0
    return result


async def queued_phase(
    server: Server, w: Workload, bodies: Sequence[Body], tick: Tick
) -> PhaseResult:
    """Post everything first, then time the drain of a full queue."""
    result = PhaseResult(rss_idle_mib=memory_mib(server.pid)["VmRSS"])
    cpu0, client0, busy0 = cpu_seconds(server.pid), time.process_time(), machine_busy_seconds()
    t0 = time.perf_counter()
    posted_at = await asyncio.wait_for(post_all(server.url, w, bodies, tick), w.timeout)
    result.groups_posted = len(bodies)
    result.post_s = posted_at - t0
    result.rss_queued_mib = memory_mib(server.pid)["VmRSS"]
    t1 = time.perf_counter()
    drained_at = await asyncio.wait_for(drain(server.url, w, result, tick), w.timeout)
    result.wall_s = drained_at - t1
    result.elapsed_s = drained_at - t0
    result.server_cpu_s = cpu_seconds(server.pid) - cpu0
    result.client_cpu_s = time.process_time() - client0
    result.other_cpu_s = machine_busy_seconds() - busy0 - result.server_cpu_s - result.client_cpu_s
    return result


Phase = Callable[[Server, Workload, Sequence[Body], Tick], Awaitable[PhaseResult]]


def _run_async(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (less client CPU), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_phase(
    phase: Phase, server: Server, w: Workload, bodies: Sequence[Body], tick: Tick
) -> PhaseResult:
    """Prepare a started server, run one phase on it, then read its memory."""

    async def go() -> PhaseResult:
        await asyncio.wait_for(prepare(server.url, w), 60)
        return await phase(server, w, bodies, tick)

    result: PhaseResult = _run_async(go())
    mem = memory_mib(server.pid)
    result.peak_rss_mib, result.final_rss_mib = mem["VmHWM"], mem["VmRSS"]
    if result.groups_drained != w.groups:
        raise RuntimeError(f"drained {result.groups_drained} groups of {w.groups}")
    return result


def measure_server(
    kind: str,
    w: Workload,
    bodies: Sequence[Body],
    *,
    store: str = "sqlite",
    python: str | None = None,
    hooks: Hooks | None = None,
    quiet_wait: float = 0.0,
    server_args: Sequence[str] = (),
) -> ServerResult:
    """Run both phases against `kind` ("ours" or "upstream"), each on a fresh server.

    Before each phase, wait up to `quiet_wait` seconds for the machine to be idle.
    `server_args` are extra command-line arguments for the server.
    """
    w.check()
    if python is None:
        python = upstream_python() if kind == "upstream" else sys.executable
    hooks = hooks or Hooks()
    phases: dict[str, PhaseResult] = {}
    command: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"api-bench-{kind}-") as tmp:
        for name, phase in (("streaming", streaming_phase), ("queued", queued_phase)):
            server = Server(kind, Path(tmp), store, python, server_args)
            command = server.argv
            try:
                if quiet_wait > 0 and (load := wait_quiet(quiet_wait)) >= 0.25:
                    hooks.log(f"[yellow]machine still busy ({load:.2f} cores); going on[/yellow]")
                hooks.log(f"{kind}: {name} phase: {' '.join(server.argv)}")
                server.start()
                hooks.phase(kind, name)
                phases[name] = run_phase(phase, server, w, bodies, hooks.tick)
            except BaseException:
                hooks.log(f"{kind}: server log tail:\n{server.log_tail()}")
                raise
            finally:
                server.stop()
    return ServerResult(kind, command, phases["streaming"], phases["queued"])


# ----- report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    label: str
    phase: str
    key: str
    fmt: str
    target: float | None = None  # ours/upstream ratio must be at most this
    absolute: float | None = None  # ours must be below this (same unit as the metric)
    target_text: str = ""


ROWS = [
    Row(
        "server CPU s / 1000 groups",
        "streaming",
        "server_cpu_s_per_1000_groups",
        ".2f",
        0.1,
        target_text="<= 1/10",
    ),
    Row("end-to-end wall s", "streaming", "wall_s", ".2f", 0.1, target_text="<= 1/10"),
    Row("throughput groups/s", "streaming", "groups_per_s", ".0f"),
    Row("/batch p50 ms", "streaming", "batch_p50_ms", ".1f"),
    Row("/batch p99 ms", "streaming", "batch_p99_ms", ".1f"),
    Row("peak RSS MiB (VmHWM)", "streaming", "peak_rss_mib", ".0f", 1 / 3, target_text="<= 1/3"),
    Row("final RSS MiB (VmRSS)", "streaming", "final_rss_mib", ".0f"),
    Row("client CPU s", "streaming", "client_cpu_s", ".2f"),
    Row("other processes' CPU s", "streaming", "other_cpu_s", ".2f"),
    Row("empty /batch polls", "streaming", "empty_polls", ".0f"),
    Row("post-all wall s", "queued", "post_s", ".2f"),
    Row("server CPU s / 1000 groups", "queued", "server_cpu_s_per_1000_groups", ".2f"),
    Row("drain wall s", "queued", "wall_s", ".2f"),
    Row("/batch p50 ms", "queued", "batch_p50_ms", ".1f"),
    Row("/batch p99 ms", "queued", "batch_p99_ms", ".1f", absolute=20.0, target_text="< 20 ms"),
    Row("/batch max ms", "queued", "batch_max_ms", ".1f"),
    Row("RSS MiB, all queued", "queued", "rss_queued_mib", ".0f"),
    Row("peak RSS MiB (VmHWM)", "queued", "peak_rss_mib", ".0f", 1 / 3, target_text="<= 1/3"),
    Row("final RSS MiB (VmRSS)", "queued", "final_rss_mib", ".0f"),
    Row("other processes' CPU s", "queued", "other_cpu_s", ".2f"),
]


def summarize(results: dict[str, ServerResult], w: Workload) -> list[dict[str, Any]]:
    """One dict per table row: values per server, ratio, target and whether it is met."""
    out = []
    for row in ROWS:
        values = {
            name: getattr(r, row.phase).summary(w.groups)[row.key] for name, r in results.items()
        }
        ours, upstream = values.get("ours"), values.get("upstream")
        ratio = ours / upstream if ours is not None and upstream else None
        met = None
        if row.target is not None and ratio is not None:
            met = ratio <= row.target
        elif row.absolute is not None and ours is not None:
            met = ours < row.absolute
        out.append(
            {
                "phase": row.phase,
                "metric": row.label,
                "key": row.key,
                "fmt": row.fmt,
                "values": values,
                "ratio": ratio,
                "target": row.target_text,
                "met": met,
            }
        )
    return out


def _cells(entry: dict[str, Any], names: Sequence[str]) -> list[str]:
    cells = [f"{entry['values'][n]:{entry['fmt']}}" for n in names]
    if len(names) == 2:
        cells.append("" if entry["ratio"] is None else f"{entry['ratio']:.3f}")
    met = entry["met"]
    verdict = "" if met is None else ("met" if met else "MISSED")
    cells += [entry["target"] or "", verdict]
    return cells


def _headers(names: Sequence[str]) -> list[str]:
    return ["phase", "metric", *names, *(["ours/upstream"] if len(names) == 2 else [])] + [
        "target",
        "verdict",
    ]


def rich_table(summary: list[dict[str, Any]], names: Sequence[str]) -> Table:
    table = Table(title="Trajectory API throughput")
    for i, h in enumerate(_headers(names)):
        table.add_column(h, justify="left" if i < 2 else "right")
    for entry in summary:
        table.add_row(entry["phase"], entry["metric"], *_cells(entry, names))
    return table


def markdown_table(summary: list[dict[str, Any]], names: Sequence[str]) -> str:
    headers = _headers(names)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
    for entry in summary:
        lines.append("| " + " | ".join([entry["phase"], entry["metric"], *_cells(entry, names)]))
        lines[-1] += " |"
    return "\n".join(lines) + "\n"


def plot(summary: list[dict[str, Any]], path: Path) -> bool:
    """Bar chart of the ours/upstream ratios; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [e for e in summary if e["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    labels = [f"{e['phase']}: {e['metric']}" for e in rows]
    ax.barh(labels, [e["ratio"] for e in rows], color="tab:blue")
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("ours / upstream (log scale, lower is better)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure the trajectory API (ours vs upstream atroposlib 0.4.0) under a"
        " realistic env/trainer workload; print a table with ours/upstream ratios.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = Workload()
    p.add_argument("--groups", type=int, default=d.groups, help="groups posted in all")
    p.add_argument("--group-size", type=int, default=d.group_size, help="sequences per group")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per sequence")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len, help="mean masked prompt")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="trainer batch size")
    p.add_argument("--connections", type=int, default=d.connections, help="env connections")
    p.add_argument("--envs", type=int, default=d.envs, help="env clients")
    p.add_argument("--gzip-level", type=int, default=d.gzip_level, help="request gzip level")
    p.add_argument(
        "--poll-interval", type=float, default=d.poll_interval, help="sleep after empty /batch"
    )
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds per phase")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the generated groups")
    p.add_argument(
        "--only",
        default="both",
        help="servers to run, comma-separated, of ours, upstream and null (the floor:"
        " benchmarks/api_null_server.py parses the same requests and discards them); both ="
        " ours,upstream",
    )
    p.add_argument(
        "--store",
        choices=["sqlite", "memory"],
        default="sqlite",
        help="our server's store (sqlite: a fresh file in a temp dir per server)",
    )
    p.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `atropos api serve` (repeatable), e.g."
        " --ours-arg=--response-gzip=always",
    )
    p.add_argument(
        "--upstream-python",
        help="python of a venv with atroposlib 0.4.0 (by default scripts/upstream_venv.py's)",
    )
    p.add_argument(
        "--encode-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that pre-encode the bodies (before any timing)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per server; the table shows the run other processes disturbed least",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before each phase, wait up to this many seconds for the machine to be idle",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run our server and the null server under cProfile; one .prof per server in DIR"
        " (read with `python -m pstats`); CPU figures then include the profiler's cost",
    )
    p.add_argument("--json", type=Path, help="write the results here as JSON")
    p.add_argument("--markdown", type=Path, help="write the table here as Markdown")
    p.add_argument("--png", type=Path, help="write a ratio bar chart here (needs matplotlib)")
    return p.parse_args(argv)


def server_names(only: str) -> list[str]:
    """`--only` as a list of server names (`both`: ours and upstream)."""
    names = list(SERVERS) if only == "both" else [n.strip() for n in only.split(",")]
    unknown = [n for n in names if n not in (*SERVERS, "null")]
    if unknown or not names:
        raise SystemExit(f"--only: unknown server {unknown}; give ours, upstream, null or both")
    return names


def null_table(results: dict[str, ServerResult], w: Workload) -> list[dict[str, Any]]:
    """Ours against the null server: server CPU per 1000 groups in each phase, and the ratio
    (target: at most `NULL_TARGET`). Empty unless both ran."""
    if "ours" not in results or "null" not in results:
        return []
    out = []
    for phase in ("streaming", "queued"):
        ours = getattr(results["ours"], phase).summary(w.groups)["server_cpu_s_per_1000_groups"]
        null = getattr(results["null"], phase).summary(w.groups)["server_cpu_s_per_1000_groups"]
        ratio = ours / null if null else math.inf
        out.append(
            {
                "phase": phase,
                "ours": ours,
                "null": null,
                "ratio": ratio,
                "met": ratio <= NULL_TARGET,
            }
        )
    return out


def markdown_null(rows: list[dict[str, Any]]) -> str:
    """`null_table` as Markdown (empty string for no rows)."""
    if not rows:
        return ""
    lines = [
        "| phase | server CPU s / 1000 groups: ours | null server | ours/null | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = "met" if r["met"] else "MISSED"
        lines.append(
            f"| {r['phase']} | {r['ours']:.2f} | {r['null']:.2f} | {r['ratio']:.2f}"
            f" | <= {NULL_TARGET:g}x | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def noise(r: ServerResult) -> float:
    """CPU seconds other processes used during a run's phases, per second of the run."""
    phases = (r.streaming, r.queued)
    return sum(p.other_cpu_s for p in phases) / sum(p.elapsed_s for p in phases)


def result_doc(r: ServerResult, w: Workload) -> dict[str, Any]:
    """A run as JSON: raw measurements and their summary, per phase."""
    return {
        "command": r.command,
        "streaming": {**asdict(r.streaming), **r.streaming.summary(w.groups)},
        "queued": {**asdict(r.queued), **r.queued.summary(w.groups)},
    }


def measure_with_progress(
    console: Console,
    name: str,
    w: Workload,
    bodies: Sequence[Body],
    store: str,
    python: str | None,
    quiet_wait: float,
    server_args: Sequence[str],
) -> ServerResult:
    """`measure_server` with a progress bar per phase for posted and drained groups."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console, refresh_per_second=4) as bar:
        tasks: dict[str, Any] = {}

        def phase(server: str, phase: str) -> None:
            for what in ("post", "drain"):
                tasks[what] = bar.add_task(f"{server} {phase}: {what}ed", total=w.groups)

        def tick(what: str, n: int) -> None:
            bar.advance(tasks[what], n)

        hooks = Hooks(log=bar.log, phase=phase, tick=tick)
        return measure_server(
            name,
            w,
            bodies,
            store=store,
            python=python,
            hooks=hooks,
            quiet_wait=quiet_wait,
            server_args=server_args,
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    w = Workload(
        groups=args.groups,
        group_size=args.group_size,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        connections=args.connections,
        envs=args.envs,
        prompt_len=args.prompt_len,
        gzip_level=args.gzip_level,
        poll_interval=args.poll_interval,
        timeout=args.timeout,
        seed=args.seed,
    )
    w.check()
    names = server_names(args.only)
    if args.profile is not None:
        global PROFILE_DIR
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE_DIR = args.profile.resolve()
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.log(f"machine: {machine()}")
    console.log(f"code: {code_version()}")
    console.log(f"workload: {asdict(w)}")

    t = time.perf_counter()
    bodies = encode_bodies(w, args.encode_workers)
    sent = sum(len(b.data) for b in bodies)
    raw = sum(b.raw_size for b in bodies)
    console.log(
        f"encoded {len(bodies)} bodies in {time.perf_counter() - t:.1f}s:"
        f" {raw / 2**20:.0f} MiB JSON, {sent / 2**20:.0f} MiB gzipped"
    )

    pythons = {"ours": sys.executable, "null": sys.executable, "upstream": args.upstream_python}
    if "upstream" in names and pythons["upstream"] is None:
        console.log("upstream: making/finding its venv (scripts/upstream_venv.py light)")
        pythons["upstream"] = upstream_python()
    runs: dict[str, list[ServerResult]] = {name: [] for name in names}
    for rep in range(args.repeat):
        for name in names:
            if args.repeat > 1:
                console.log(f"{name}: run {rep + 1} of {args.repeat}")
            r = measure_with_progress(
                console,
                name,
                w,
                bodies,
                args.store,
                pythons[name],
                args.quiet_wait,
                args.ours_arg if name == "ours" else [],
            )
            runs[name].append(r)
            s, q = r.streaming.summary(w.groups), r.queued.summary(w.groups)
            console.log(
                f"{name}: streaming {s['wall_s']:.2f}s, {s['server_cpu_s_per_1000_groups']:.2f}"
                f" CPU s per 1000 groups; queued /batch p99 {q['batch_p99_ms']:.1f} ms;"
                f" other processes used {s['other_cpu_s'] + q['other_cpu_s']:.1f} CPU s"
            )
    # Of repeated runs, report the one other processes disturbed least.
    results = {name: min(rs, key=noise) for name, rs in runs.items()}
    for name, r in results.items():
        for phase, p in (("streaming", r.streaming), ("queued", r.queued)):
            if p.other_cpu_s > 0.1 * p.elapsed_s:
                console.log(
                    f"[yellow]warning: other processes used {p.other_cpu_s:.1f} CPU s during"
                    f" {name}'s {phase} phase; its timings are noisy[/yellow]"
                )

    versus = [n for n in names if n != "null"]
    summary = summarize(results, w)
    console.print(rich_table(summary, versus))
    floor = null_table(results, w)
    if floor:
        console.print(markdown_null(floor))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": [Path(sys.executable).name, *sys.argv],
            "machine": machine(),
            "code": code_version(),
            "workload": asdict(w),
            "store": args.store,
            "bytes": {"json": raw, "sent": sent},
            "servers": {n: result_doc(r, w) for n, r in results.items()},
            "all_runs": {n: [result_doc(r, w) for r in rs] for n, rs in runs.items()},
            "table": [{k: v for k, v in e.items() if k != "fmt"} for e in summary],
            "against_null": floor,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        console.log(f"wrote {args.json}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_table(summary, versus) + markdown_null(floor))
        console.log(f"wrote {args.markdown}")
    if args.png:
        if plot(summary, args.png):
            console.log(f"wrote {args.png}")
        else:
            console.log("matplotlib is not installed: no chart")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def upstream_python() -> str:
    """The python of the upstream venv (light: made on first use)."""
    return _upstream_python("light")
