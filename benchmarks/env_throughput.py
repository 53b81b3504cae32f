#!/usr/bin/env python3
"""Environment runtime throughput: our env runtime against upstream atroposlib 0.4.0's BaseEnv.

Both runtimes run the same single-turn task (`benchmarks/envs/single_turn_task.py`: a system
prompt and a short question per item, one `n = group_size` request per item for token ids and
logprobs, a trivial score), as separate processes, against the same fake inference server
(`python -m atropos.testing.fake_server --latency L`: the vLLM-style `/generate`, every request
answered after a fixed sleep, in its own process). Ours is `benchmarks/envs/ours_single_turn.py`
(`atropos.envs.simple.Env`); upstream's is `benchmarks/envs/upstream_single_turn.py`, run by the
python of `scripts/upstream_venv.py full`, through upstream's own CLI and `ManagedServer`.

Modes, each run on fresh processes:

* serve: the env registers with our trajectory API (`atropos api serve --store memory`, its own
  process) and keeps `--workers` groups in flight; a trainer (in this process) registers with
  `batch_size` and drains `GET /batch` back to back, sleeping 5 ms after an empty answer, so the
  env never waits on the trainer (`max_batches_offpolicy` is set out of reach). Rollouts are
  counted as the trainer receives them.
* process: the env makes groups into a JSONL file, `--workers` at a time (upstream's process
  mode is sequential: one group at a time whatever the flag says); rollouts are counted from the
  file as it grows.

A rollout is one completion. A worker is one `collect_trajectories` in flight, i.e. one group:
`group_size` (G) completions requested as ONE `n = G` request, which the fake server answers
after `latency` seconds. So the ideal is `workers * G / latency` rollouts per second: every
worker always waiting on the server, the env costing no time at all. `--group-size 1` makes a
rollout one request (the ideal is then `workers / latency`). After the first rollout and
`--warmup` seconds, we count rollouts over a `--duration` second window and read, from /proc,
the CPU time (utime + stime, reaped children included) of each process tree over the same
window: the env, the fake server, the API, this process (the trainer) and everything else on the
machine ("other processes' CPU s", from /proc/stat: noise in the timings).

The machine has a ceiling of its own: "loop CPU us/rollout" is the CPU all the loop's
processes (env + fake server + API + trainer) spent per rollout, and "all-cores ceiling" the
rate at which every core would be busy at that cost (`nproc / loop CPU per rollout`): what this
machine could give at most, whatever the runtime's concurrency. "% of ceiling" is the measured
rate against it; where the ideal is above the ceiling, no runtime can reach the ideal here.

When both runtimes ran in process mode, their JSONL files are compared group by group for the
prompts both made (the fake server answers a prompt the same way every time): every group must
hold the same tokens, masks, inference logprobs and scores, which checks that the two envs do
the same work.

Usage:
    .venv/bin/python benchmarks/env_throughput.py --json benchmarks/results/env_throughput.json \
        --markdown benchmarks/results/env_throughput.md
    .venv/bin/python benchmarks/env_throughput.py --only ours --workers 256 --modes serve
    .venv/bin/python benchmarks/env_throughput.py --workers 1024 --group-size 1 --modes serve \
        --json benchmarks/results/env_throughput_g1.json   # one rollout = one request (extra)
    .venv/bin/python benchmarks/env_throughput.py --only ours --workers 1024 --modes serve \
        --profile runs/env-profile   # py-spy on our env during the window (slows it down)

Needs aiohttp and msgspec (dev extra); `--profile` needs py-spy. Every server binds 127.0.0.1
and is stopped when its run ends, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
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
ENVS = ROOT / "benchmarks" / "envs"
RUNTIMES = ("ours", "upstream")
MODES = ("serve", "process")
MODEL = "atropos-tiny"


# ----- workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What every run does; the same for both runtimes."""

    group_size: int = 8
    latency: float = 0.2  # seconds the fake server waits before answering a request
    max_tokens: int = 8  # completion limit of every request
    batch_size: int = 512  # the trainer's batch, in sequences (serve)
    warmup: float = 5.0  # seconds after the first rollout before the window opens
    duration: float = 20.0  # the measured window, seconds
    offpolicy: int = 1_000_000  # max_batches_offpolicy: out of reach, the env never pauses
    total_steps: int = 1_000_000  # far beyond the window: runs are stopped after it
    start_timeout: float = 120.0  # seconds to wait for the first rollout
    poll_interval: float = 0.005  # trainer's sleep after an empty /batch

    def check(self) -> None:
        if self.group_size < 1 or self.batch_size % self.group_size:
            raise SystemExit("--group-size must be >= 1 and divide --batch-size")
        if self.latency <= 0 or self.duration <= 0 or self.warmup < 0 or self.max_tokens < 1:
            raise SystemExit("need --latency, --duration > 0, --warmup >= 0, --max-tokens >= 1")

    def ideal(self, workers: int) -> float:
        """Rollouts per second if every worker always waited on the server and cost nothing."""
        return workers * self.group_size / self.latency


# ----- processes and /proc ---------------------------------------------------------------------


def self_cpu_seconds() -> float:
    """CPU of this process (all threads: the trainer, the progress bar)."""
    t = os.times()
    return t.user + t.system


def rss_mib(pid: int) -> float:
    """VmRSS of `pid`'s tree, in MiB."""
    total = 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
    return total


class Proc:
    """A child process in its own session, logging to a file; `stop()` ends its whole group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        workdir: Path,
        env: dict[str, str] | None = None,
        health_url: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.env = env
        self.health_url = health_url
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    @property
    def url(self) -> str:
        """The server's root URL (its health URL without the path)."""
        assert self.health_url is not None, f"{self.name} is not a server"
        return self.health_url.rsplit("/", 1)[0]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self, timeout: float = 60.0) -> None:
        """Start it; when it has a health URL, wait until that answers 200."""
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stop() reaches its children too
            )
        if self.health_url is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            if await asyncio.to_thread(_answers, self.health_url):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready in {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM its process group, then SIGKILL after `grace` seconds; safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_count(self, pattern: str) -> int:
        try:
            return len(re.findall(pattern, self.log_path.read_text(errors="replace")))
        except OSError:
            return 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def tiny_tokenizer() -> str:
    from atropos.testing import tiny_tokenizer_path

    return tiny_tokenizer_path()


# ----- the env's command line -------------------------------------------------------------------


def env_argv(
    runtime: str,
    mode: str,
    python: str,
    w: Workload,
    workers: int,
    fake_url: str,
    api_url: str | None,
    data_path: Path | None,
) -> list[str]:
    """The env's command: the same settings for both runtimes, in each one's own flags."""
    script = ENVS / f"{runtime}_single_turn.py"
    argv = [python, str(script), mode]
    argv += ["--env.group_size", str(w.group_size), "--env.max_num_workers", str(workers)]
    argv += ["--env.total_steps", str(w.total_steps), "--env.wandb_name", "bench_single_turn"]
    argv += ["--env.use_wandb", "false", "--env.ensure_scores_are_not_same", "false"]
    argv += ["--openai.base_url", fake_url + "/v1", "--openai.server_type", "vllm"]
    argv += ["--openai.model_name", MODEL]
    # capacity per server: never below the worker count, so only the workers limit concurrency
    argv += ["--openai.num_max_requests_at_once", str(max(512, workers))]
    if mode == "serve":
        assert api_url is not None
        argv += ["--env.rollout_server_url", api_url]
        argv += ["--env.max_batches_offpolicy", str(w.offpolicy)]
    else:
        assert data_path is not None
        argv += ["--env.data_path_to_save_groups", str(data_path)]
    if runtime == "ours":
        # our vLLM backend speaks upstream's /generate when asked (its default is /v1/completions)
        argv += ["--env.tokenizer_name", "tiny", "--openai.vllm_token_api", "generate"]
    else:
        tok = tiny_tokenizer()
        argv += ["--env.tokenizer_name", tok, "--openai.tokenizer_name", tok]
        argv += ["--openai.api_key", "x"]  # its OpenAI client refuses an empty key
    return argv


# ----- the trainer ------------------------------------------------------------------------------


class _Group(msgspec.Struct):
    tokens: list[list[int]]


class _BatchDoc(msgspec.Struct):
    batch: list[_Group] | None = None


_batch_decoder = msgspec.json.Decoder(_BatchDoc)
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60)


class Counter:
    """Rollouts seen so far (sequences drained, or groups written x group size)."""

    def __init__(self) -> None:
        self.rollouts = 0
        self.groups = 0
        self.first_at: float | None = None

    def add(self, groups: int, rollouts: int) -> None:
        if self.first_at is None and rollouts:
            self.first_at = time.monotonic()
        self.groups += groups
        self.rollouts += rollouts


async def register_trainer(url: str, w: Workload) -> None:
    registration = {
        "wandb_group": "bench",
        "wandb_project": "env-throughput",
        "batch_size": w.batch_size,
        "max_token_len": 2048,
        "checkpoint_dir": "checkpoints",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": w.total_steps,
    }
    async with aiohttp.ClientSession(url, timeout=REQUEST_TIMEOUT) as s:
        async with s.post("/register", json=registration) as resp:
            if resp.status != 200:
                raise RuntimeError(f"POST /register: HTTP {resp.status}: {await resp.text()}")


async def drain(url: str, w: Workload, counter: Counter, stats: dict[str, int]) -> None:
    """GET /batch back to back until cancelled, counting sequences."""
    async with aiohttp.ClientSession(
        url, connector=aiohttp.TCPConnector(limit=1), timeout=REQUEST_TIMEOUT
    ) as s:
        while True:
            async with s.get("/batch") as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"GET /batch: HTTP {resp.status}: {data[:300]!r}")
            batch = _batch_decoder.decode(data).batch
            if not batch:
                stats["empty_polls"] += 1
                await asyncio.sleep(w.poll_interval)
                continue
            stats["batches"] += 1
            counter.add(len(batch), sum(len(g.tokens) for g in batch))


async def follow_jsonl(path: Path, w: Workload, counter: Counter) -> None:
    """Count the groups (lines) the env writes to `path`, as they are written."""
    offset = 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            lines = chunk.count(b"\n")
            offset += chunk.rindex(b"\n") + 1 if lines else 0
            counter.add(lines, lines * w.group_size)
        await asyncio.sleep(0.05)


# ----- one run -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one run measured over its window. CPU in seconds."""

    runtime: str
    mode: str
    workers: int  # --env.max_num_workers (upstream's process mode runs 1 group at a time)
    repeat: int = 1
    command: list[str] = field(default_factory=list)
    window_s: float = 0.0
    rollouts: int = 0
    groups: int = 0
    env_cpu_s: float = 0.0
    fake_server_cpu_s: float = 0.0
    api_cpu_s: float = 0.0
    bench_cpu_s: float = 0.0  # this process: the trainer (serve) or the file follower
    other_cpu_s: float = 0.0
    machine_busy_s: float = 0.0
    env_rss_mib: float = 0.0
    startup_s: float = 0.0  # env start -> first rollout
    batches: int = 0
    empty_polls: int = 0
    env_log_errors: int = 0  # "Traceback" / "Error" lines in the env's log
    ideal_per_s: float = 0.0
    group_size: int = 8  # completions per group (one request with n = group_size)
    nproc: int = field(default_factory=lambda: os.cpu_count() or 1)
    profile: str | None = None
    groups_file: str | None = None  # process mode: the env's JSONL (for the same-work check)
    series: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(seconds into the window, rollouts so far, env CPU s so far, env RSS MiB), each second."""

    @property
    def concurrency(self) -> int:
        """Groups the runtime really keeps in flight."""
        return 1 if (self.runtime, self.mode) == ("upstream", "process") else self.workers

    def summary(self) -> dict[str, float]:
        rate = self.rollouts / self.window_s if self.window_s else 0.0
        loop_cpu = self.env_cpu_s + self.fake_server_cpu_s + self.api_cpu_s + self.bench_cpu_s
        per = self.env_cpu_s / self.rollouts if self.rollouts else 0.0
        ceiling = self.rollouts * self.nproc / loop_cpu if loop_cpu else 0.0
        return {
            "rollouts_per_s": rate,
            "groups_per_s": self.groups / self.window_s if self.window_s else 0.0,
            "ideal_per_s": self.ideal_per_s,
            "pct_of_ideal": 100 * rate / self.ideal_per_s if self.ideal_per_s else 0.0,
            "env_cpu_us_per_rollout": per * 1e6,
            "env_cores": self.env_cpu_s / self.window_s if self.window_s else 0.0,
            "fake_server_cores": self.fake_server_cpu_s / self.window_s if self.window_s else 0.0,
            "api_cores": self.api_cpu_s / self.window_s if self.window_s else 0.0,
            "bench_cores": self.bench_cpu_s / self.window_s if self.window_s else 0.0,
            "machine_cores": self.machine_busy_s / self.window_s if self.window_s else 0.0,
            "other_cpu_s": self.other_cpu_s,
            # the rate with every core busy at this run's CPU per rollout of the loop's processes
            # (env, fake server, API, trainer; other processes' noise left out)
            "cpu_ceiling_per_s": ceiling,
            "loop_cpu_us_per_rollout": 1e6 * loop_cpu / self.rollouts if self.rollouts else 0.0,
            "pct_of_ceiling": 100 * rate / ceiling if ceiling else 0.0,
        }


@dataclass
class Hooks:
    """Progress reporting (all optional)."""

    log: Callable[[str], None] = print
    status: Callable[[str, float, float], None] = lambda text, done, total: None


def _snapshot(pids: dict[str, int]) -> dict[str, float]:
    snap = {name: cpu_seconds(pid) for name, pid in pids.items()}
    snap["bench"] = self_cpu_seconds()
    snap["machine"] = machine_busy_seconds()
    snap["t"] = time.monotonic()
    return snap


async def measure_run(
    runtime: str,
    mode: str,
    workers: int,
    w: Workload,
    python: str,
    workdir: Path,
    hooks: Hooks,
    profile_dir: Path | None = None,
    repeat: int = 1,
    ours_src: Path | None = None,
) -> RunResult:
    """Start the servers and the env, measure the window, stop everything. `repeat` (1, 2, ...)
    names the run's directory (logs, data, profile) when a configuration runs more than once;
    `ours_src`: our env imports `atropos` from there (a `git archive` of another commit)."""
    label = f"{runtime} {mode} {workers}"
    suffix = "" if repeat == 1 else f"-r{repeat}"
    run_dir = workdir / f"{runtime}-{mode}-{workers}{suffix}"
    run_dir.mkdir(parents=True)
    child_env = {**os.environ, "BENCH_MAX_TOKENS": str(w.max_tokens), "PYTHONUNBUFFERED": "1"}
    child_env.pop("PYTHONPATH", None)
    if ours_src is not None and runtime == "ours":
        child_env["PYTHONPATH"] = str(ours_src.resolve())
    fake_port = free_port()
    fake = Proc(
        "fake-server",
        [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(fake_port)]
        + ["--latency", str(w.latency), "--model", MODEL],
        run_dir,
        health_url=f"http://127.0.0.1:{fake_port}/health",
    )
    api: Proc | None = None
    env: Proc | None = None
    tasks: list[asyncio.Task[None]] = []
    result = RunResult(runtime, mode, workers, repeat=repeat, group_size=w.group_size)
    counter = Counter()
    stats: collections.Counter[str] = collections.Counter()
    profiler: subprocess.Popen[bytes] | None = None
    try:
        await fake.start()
        api_url = data_path = None
        if mode == "serve":
            api_port = free_port()
            api_url = f"http://127.0.0.1:{api_port}"
            api = Proc(
                "api",
                [sys.executable, "-m", "atropos", "api", "serve", "--store", "memory"]
                + ["--host", "127.0.0.1", "--port", str(api_port)],
                run_dir,
                health_url=api_url + "/health",
            )
            await api.start()
            await register_trainer(api_url, w)
            tasks.append(asyncio.create_task(drain(api_url, w, counter, stats)))
        else:
            data_path = run_dir / "data" / "groups.jsonl"
            result.groups_file = str(data_path)
            tasks.append(asyncio.create_task(follow_jsonl(data_path, w, counter)))
        argv = env_argv(runtime, mode, python, w, workers, fake.url, api_url, data_path)
        result.command = argv
        env = Proc("env", argv, run_dir, env=child_env)
        hooks.log(f"{label}: {' '.join(argv)}")
        started = time.monotonic()
        await env.start()
        while counter.first_at is None:
            if not env.alive():
                raise RuntimeError(f"{label}: the env exited:\n{env.log_tail()}")
            for t in tasks:
                if t.done():
                    t.result()  # raises what broke the trainer
            waited = time.monotonic() - started
            if waited > w.start_timeout:
                raise TimeoutError(f"{label}: no rollout in {waited:.0f}s:\n{env.log_tail()}")
            hooks.status(f"{label}: starting", 0, w.warmup + w.duration)
            await asyncio.sleep(0.1)
        result.startup_s = counter.first_at - started
        while time.monotonic() < counter.first_at + w.warmup:
            hooks.status(f"{label}: warm-up", time.monotonic() - counter.first_at, 0)
            await asyncio.sleep(0.1)
        pids = {"env": env.pid, "fake": fake.pid, **({"api": api.pid} if api else {})}
        name = label.replace(" ", "-") + suffix
        profile_base = None if profile_dir is None else profile_dir / name
        if profile_base is not None:
            profiler = start_profiler(env.pid, w.duration, profile_base)
        r0, b0 = counter.rollouts, stats["batches"]
        g0, e0 = counter.groups, stats["empty_polls"]
        s0 = _snapshot(pids)
        end, next_point = s0["t"] + w.duration, s0["t"]
        while (now := time.monotonic()) < end:
            if not env.alive():
                raise RuntimeError(f"{label}: the env exited mid-window:\n{env.log_tail()}")
            if now >= next_point:
                cpu = cpu_seconds(env.pid) - s0["env"]
                point = (round(now - s0["t"], 3), counter.rollouts - r0, cpu, rss_mib(env.pid))
                result.series.append(point)
                next_point += 1.0
            rate = (counter.rollouts - r0) / max(now - s0["t"], 1e-9)
            hooks.status(f"{label}: measuring, {rate:,.0f} rollouts/s", now - s0["t"], w.duration)
            await asyncio.sleep(0.1)
        s1 = _snapshot(pids)
        result.rollouts, result.groups = counter.rollouts - r0, counter.groups - g0
        result.batches, result.empty_polls = stats["batches"] - b0, stats["empty_polls"] - e0
        result.window_s = s1["t"] - s0["t"]
        result.env_cpu_s = s1["env"] - s0["env"]
        result.fake_server_cpu_s = s1["fake"] - s0["fake"]
        result.api_cpu_s = s1.get("api", 0.0) - s0.get("api", 0.0)
        result.bench_cpu_s = s1["bench"] - s0["bench"]
        result.machine_busy_s = s1["machine"] - s0["machine"]
        known = result.env_cpu_s + result.fake_server_cpu_s + result.api_cpu_s
        result.other_cpu_s = result.machine_busy_s - known - result.bench_cpu_s
        result.env_rss_mib = rss_mib(env.pid)
        result.ideal_per_s = w.ideal(result.concurrency)
        if profiler is not None:
            profiler.wait(timeout=w.duration + 60)
            result.profile = f"{profile_base}.txt"
        return result
    except BaseException:
        for proc in (env, api, fake):
            if proc is not None and proc.proc is not None:
                hooks.log(f"{label}: {proc.name} log tail:\n{proc.log_tail()}")
        raise
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if profiler is not None and profiler.poll() is None:
            profiler.terminate()
            profiler.wait(timeout=10)
        for proc in (env, api, fake):  # the env first: it may still be sending
            if proc is not None:
                await asyncio.to_thread(proc.stop)
        if env is not None:
            result.env_log_errors = env.log_count(r"Traceback|\bERROR\b|rollout failed")


# ----- profiling ---------------------------------------------------------------------------------


def start_profiler(pid: int, duration: float, base: Path) -> subprocess.Popen[bytes]:
    """py-spy on `pid` for `duration` s at 100 Hz, raw (collapsed) stacks to `base`.txt."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    base.parent.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "-p", str(pid), "-d", str(int(duration)), "-r", "100"]
    argv += ["-f", "raw", "-o", f"{base}.txt", "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def profile_summary(path: Path, top: int = 25) -> dict[str, list[tuple[str, float]]]:
    """Shares of samples from a py-spy raw file: `self` (leaf frames), `inclusive` (frames
    anywhere on the stack), and `ours` (inclusive, frames in src/atropos only)."""
    incl: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        names = []
        for frame in stack.split(";"):
            m = _FRAME.match(frame)
            names.append(f"{m['file']}:{m['func']}" if m else frame)
        for name in set(names):
            incl[name] += count
        leaf[names[-1]] += count
    if not total:
        return {"self": [], "inclusive": [], "ours": []}

    def share(c: collections.Counter[str], keep: Callable[[str], bool]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in c.most_common() if keep(k)][:top]

    return {
        "self": share(leaf, lambda k: True),
        "inclusive": share(incl, lambda k: True),
        "ours": share(incl, lambda k: "atropos/" in k and "site-packages" not in k),
    }


# ----- same work ----------------------------------------------------------------------------------


def _prompt_key(group: dict[str, Any]) -> tuple[int, ...]:
    """The group's prompt: the masked (-100) head of its first sequence."""
    tokens, masks = group["tokens"][0], group["masks"][0]
    n = next((i for i, m in enumerate(masks) if m != -100), len(masks))
    return tuple(tokens[:n])


def _rows(group: dict[str, Any]) -> tuple[Any, ...]:
    return (group["tokens"], group["masks"], group.get("inference_logprobs"), group["scores"])


def same_work(ours_files: Sequence[str], upstream_files: Sequence[str]) -> dict[str, int]:
    """Compare the groups both runtimes wrote for the same prompts (the fake server answers a
    prompt the same way every time): tokens, masks, inference logprobs and scores must match."""
    reference: dict[tuple[int, ...], tuple[Any, ...]] = {}
    for path in upstream_files:
        with open(path, "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    group = json.loads(line)
                    reference[_prompt_key(group)] = _rows(group)
    compared = identical = 0
    for path in ours_files:
        with open(path, "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    group = json.loads(line)
                    want = reference.get(_prompt_key(group))
                    if want is not None:
                        compared += 1
                        identical += _rows(group) == want
    return {"prompts_upstream": len(reference), "groups_compared": compared, "identical": identical}


# ----- report -------------------------------------------------------------------------------------


def _config(r: RunResult) -> tuple[str, str, int, int]:
    return (r.runtime, r.mode, r.workers, r.group_size)


def noise(r: RunResult) -> float:
    """CPU seconds other processes used during the run's window, per second of it."""
    return r.other_cpu_s / r.window_s if r.window_s else 0.0


def least_disturbed(results: list[RunResult]) -> list[RunResult]:
    """Each configuration's run that other processes disturbed least, in the order the
    configurations first ran."""
    groups: dict[tuple[str, str, int, int], list[RunResult]] = {}
    for r in results:
        groups.setdefault(_config(r), []).append(r)
    return [min(runs, key=noise) for runs in groups.values()]


SPREAD_HEADERS = [
    "runtime",
    "mode",
    "workers",
    "runs",
    "rollouts/s min / median / max",
    "env CPU us/rollout min / median / max",
]


def spread_rows(results: list[RunResult]) -> list[list[str]]:
    """Per configuration, the spread of the two headline numbers over the repeats."""
    groups: dict[tuple[str, str, int, int], list[RunResult]] = {}
    for r in results:
        groups.setdefault(_config(r), []).append(r)
    rows = []
    for (runtime, mode, _, _), runs in groups.items():
        rates = [r.summary()["rollouts_per_s"] for r in runs]
        cpus = [r.summary()["env_cpu_us_per_rollout"] for r in runs]
        rows.append(
            [
                runtime,
                mode,
                _workers_text(runs[0]),
                str(len(runs)),
                f"{min(rates):,.0f} / {_median(rates):,.0f} / {max(rates):,.0f}",
                f"{min(cpus):.0f} / {_median(cpus):.0f} / {max(cpus):.0f}",
            ]
        )
    return rows


def run_rows(results: list[RunResult], target_pct: float) -> list[dict[str, Any]]:
    """One row per run: throughput against the ideal, CPU, and the verdict (ours only)."""
    rows = []
    for r in results:
        s = r.summary()
        met = None
        if r.runtime == "ours":
            met = s["pct_of_ideal"] >= target_pct
        rows.append({"run": r, "s": s, "met": met})
    return rows


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def cpu_rows(
    results: list[RunResult], target_ratio: float, every_run: list[RunResult] | None = None
) -> list[dict[str, Any]]:
    """Ours against upstream, CPU per rollout of the env process, where both ran: the median
    over every run of a configuration (`every_run`, default `results`), so one noisy repeat
    does not decide the ratio."""
    pool = every_run if every_run is not None else results
    per: dict[tuple[str, str, int, int], list[float]] = {}
    for r in pool:
        per.setdefault(_config(r), []).append(r.summary()["env_cpu_us_per_rollout"])
    out = []
    by = {_config(r): r for r in results}
    ups = [r for r in results if r.runtime == "upstream"]
    for ours in [r for r in results if r.runtime == "ours"]:
        up = by.get(("upstream", ours.mode, ours.workers, ours.group_size))
        if up is None and ours.mode == "process":  # upstream's process mode: one setting only
            same = (u for u in ups if u.mode == "process" and u.group_size == ours.group_size)
            up = next(same, None)
        if up is None:
            continue
        a, b = _median(per[_config(ours)]), _median(per[_config(up)])
        ratio = a / b if b else None
        met = None if ratio is None else ratio <= target_ratio
        runs = min(len(per[_config(ours)]), len(per[_config(up)]))
        out.append(
            {"ours": ours, "upstream": up, "ours_us": a, "upstream_us": b, "runs": runs}
            | {"ratio": ratio, "met": met}
        )
    return out


def _verdict(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "MISSED")


def _workers_text(r: RunResult, with_group: bool = True) -> str:
    text = f"{r.workers} (runs 1)" if r.concurrency != r.workers else str(r.workers)
    if with_group and r.group_size != Workload().group_size:
        text += f", G={r.group_size}"
    return text


RUN_HEADERS = [
    "runtime",
    "mode",
    "workers",
    "G",
    "rollouts/s",
    "ideal/s",
    "% of ideal",
    "target",
    "verdict",
    "env CPU us/rollout",
    "loop CPU us/rollout",
    "all-cores ceiling/s",
    "% of ceiling",
    "env cores",
    "fake server cores",
    "API cores",
    "trainer cores",
    "machine cores",
    "other processes' CPU s",
]


def _run_cells(row: dict[str, Any], target_pct: float) -> list[str]:
    r, s = row["run"], row["s"]
    return [
        r.runtime,
        r.mode,
        _workers_text(r, with_group=False),
        str(r.group_size),
        f"{s['rollouts_per_s']:,.0f}",
        f"{s['ideal_per_s']:,.0f}",
        f"{s['pct_of_ideal']:.1f}",
        f">= {target_pct:g}%" if r.runtime == "ours" else "",
        _verdict(row["met"]),
        f"{s['env_cpu_us_per_rollout']:.0f}",
        f"{s['loop_cpu_us_per_rollout']:.0f}",
        f"{s['cpu_ceiling_per_s']:,.0f}",
        f"{s['pct_of_ceiling']:.0f}",
        f"{s['env_cores']:.2f}",
        f"{s['fake_server_cores']:.2f}",
        f"{s['api_cores']:.2f}" if r.mode == "serve" else "",
        f"{s['bench_cores']:.2f}",
        f"{s['machine_cores']:.2f}",
        f"{s['other_cpu_s']:.2f}",
    ]


CPU_HEADERS = [
    "mode",
    "workers (ours / upstream)",
    "runs",
    "ours env CPU us/rollout (median)",
    "upstream env CPU us/rollout (median)",
    "ours/upstream",
    "target",
    "verdict",
]


def _cpu_cells(row: dict[str, Any], target_ratio: float) -> list[str]:
    ours, up = row["ours"], row["upstream"]
    mode = ours.mode if ours.mode == up.mode else f"{ours.mode} / {up.mode}"
    return [
        mode,
        f"{ours.workers} / {_workers_text(up)}",
        str(row["runs"]),
        f"{row['ours_us']:.0f}",
        f"{row['upstream_us']:.0f}",
        "" if row["ratio"] is None else f"{row['ratio']:.3f}",
        f"<= 1/{1 / target_ratio:g}",
        _verdict(row["met"]),
    ]


def rich_tables(
    results: list[RunResult],
    target_pct: float,
    target_ratio: float,
    every_run: list[RunResult] | None = None,
) -> list[Table]:
    t1 = Table(title="Environment throughput (one rollout = one completion)")
    for i, h in enumerate(RUN_HEADERS):
        t1.add_column(h, justify="left" if i < 3 else "right")
    for row in run_rows(results, target_pct):
        t1.add_row(*_run_cells(row, target_pct))
    tables = [t1]
    rows = cpu_rows(results, target_ratio, every_run)
    if rows:
        t2 = Table(title="Env process CPU per rollout, ours vs upstream")
        for i, h in enumerate(CPU_HEADERS):
            t2.add_column(h, justify="left" if i < 2 else "right")
        for row in rows:
            t2.add_row(*_cpu_cells(row, target_ratio))
        tables.append(t2)
    return tables


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def markdown(
    results: list[RunResult],
    target_pct: float,
    target_ratio: float,
    every_run: list[RunResult] | None = None,
) -> str:
    text = _md(RUN_HEADERS, [_run_cells(r, target_pct) for r in run_rows(results, target_pct)])
    rows = cpu_rows(results, target_ratio, every_run)
    if rows:
        text += "\n" + _md(CPU_HEADERS, [_cpu_cells(r, target_ratio) for r in rows])
    return text


# ----- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure env runtimes (ours vs upstream atroposlib 0.4.0) on one single-turn"
        " task against a fake inference server with a fixed latency: rollouts per second"
        " against the ideal, and the env process's CPU per rollout.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = Workload()
    p.add_argument("--workers", type=int, nargs="+", default=[256, 1024], help="max_num_workers")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="run modes")
    p.add_argument("--only", choices=[*RUNTIMES, "both"], default="both", help="runtimes to run")
    p.add_argument("--group-size", type=int, default=d.group_size, help="completions per group")
    p.add_argument("--latency", type=float, default=d.latency, help="fake server latency, s")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="completion limit")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="trainer batch (serve)")
    p.add_argument("--warmup", type=float, default=d.warmup, help="seconds before the window")
    p.add_argument("--duration", type=float, default=d.duration, help="window length, seconds")
    p.add_argument(
        "--start-timeout", type=float, default=d.start_timeout, help="wait for the first rollout"
    )
    p.add_argument(
        "--upstream-python",
        help="python of a venv with atroposlib 0.4.0 and its BaseEnv dependencies"
        " (default: scripts/upstream_venv.py full)",
    )
    p.add_argument(
        "--target-pct", type=float, default=90.0, help="ours: rollouts/s as %% of the ideal"
    )
    p.add_argument(
        "--target-ratio", type=float, default=0.2, help="ours/upstream env CPU per rollout"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before each run, wait up to this many seconds for the machine to be idle",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record our env with py-spy during each window (raw stacks + a summary in DIR);"
        " the profiler costs CPU, so profiled runs are not for the table",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole plan this many times; tables show each configuration's run that"
        " other processes disturbed least, and the spread over the repeats",
    )
    p.add_argument(
        "--ours-src",
        type=Path,
        metavar="DIR",
        help="our env imports atropos from DIR (e.g. the src/ of a `git archive` of another"
        " commit, to measure before and after on a tree others are editing); default: this"
        " checkout",
    )
    p.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir, removed)")
    p.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="measure nothing: rebuild the tables from a JSON this script wrote",
    )
    p.add_argument("--json", type=Path, help="write the results here as JSON")
    p.add_argument("--markdown", type=Path, help="write the tables here as Markdown")
    return p.parse_args(argv)


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """The runs, in order: for each mode and worker count, ours then upstream (upstream's
    process mode once: it runs one group at a time whatever max_num_workers says)."""
    runtimes = list(RUNTIMES) if args.only == "both" else [args.only]
    runs = []
    for mode in args.modes:
        for i, workers in enumerate(args.workers):
            for runtime in runtimes:
                if runtime == "upstream" and mode == "process" and i > 0:
                    continue
                runs.append((runtime, mode, workers))
    return runs


async def run_all(
    args: argparse.Namespace, w: Workload, console: Console, pythons: dict[str, str], work: Path
) -> list[RunResult]:
    results = []
    columns = [TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
    runs = plan(args)
    for repeat, runtime, mode, workers in [
        (rep, *run) for rep in range(1, args.repeat + 1) for run in runs
    ]:
        if args.repeat > 1 and (runtime, mode, workers) == runs[0]:
            console.log(f"repeat {repeat} of {args.repeat}")
        if args.quiet_wait > 0:
            load = await asyncio.to_thread(wait_quiet, args.quiet_wait)
            if load >= 0.25:
                console.log(f"[yellow]machine still busy ({load:.2f} cores); going on[/yellow]")
        with Progress(*columns, console=console, refresh_per_second=4) as bar:
            task = bar.add_task(f"{runtime} {mode} {workers}", total=w.duration)

            def status(text: str, done: float, total: float, task: Any = task) -> None:
                bar.update(task, description=text, completed=done if total else 0)

            hooks = Hooks(log=bar.log, status=status)
            r = await measure_run(
                runtime,
                mode,
                workers,
                w,
                pythons[runtime],
                work,
                hooks,
                args.profile,
                repeat,
                args.ours_src,
            )
        s = r.summary()
        console.log(
            f"{runtime} {mode} {workers} G={w.group_size}: {s['rollouts_per_s']:,.0f} rollouts/s"
            f" ({s['pct_of_ideal']:.1f}% of {s['ideal_per_s']:,.0f} ideal,"
            f" {s['pct_of_ceiling']:.0f}% of the {s['cpu_ceiling_per_s']:,.0f} all-cores ceiling),"
            f" env {s['env_cpu_us_per_rollout']:.0f} us CPU/rollout on {s['env_cores']:.2f}"
            f" cores; loop {s['loop_cpu_us_per_rollout']:.0f} us CPU/rollout; machine"
            f" {s['machine_cores']:.2f} cores; others {r.other_cpu_s:.2f} CPU s"
        )
        if r.other_cpu_s > 0.1 * r.window_s:
            console.log(
                f"[yellow]warning: other processes used {r.other_cpu_s:.1f} CPU s during the"
                " window; its numbers are noisy[/yellow]"
            )
        if r.profile:
            summary = profile_summary(Path(r.profile))
            Path(r.profile).with_suffix(".summary.json").write_text(json.dumps(summary, indent=1))
            console.log(f"profile of our env: {r.profile}; in our code (inclusive):")
            for name, share in summary["ours"][:15]:
                console.log(f"  {100 * share:5.1f}%  {name}")
        results.append(r)
    return results


def measure(args: argparse.Namespace, w: Workload, console: Console) -> dict[str, Any]:
    """Run the plan; return the report's document (every run, the same-work check, context)."""
    context = {"machine": machine(), "code": code_version()}  # before: others may commit meanwhile
    pythons = {"ours": sys.executable, "upstream": args.upstream_python or ""}
    if args.only in ("upstream", "both") and not pythons["upstream"]:
        console.log("upstream: making/finding its venv (scripts/upstream_venv.py full)")
        pythons["upstream"] = upstream_python()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        work_ctx: Any = contextlib.nullcontext(str(args.workdir))
    else:
        work_ctx = tempfile.TemporaryDirectory(prefix="env-bench-")
    with work_ctx as work:
        every_run = asyncio.run(run_all(args, w, console, pythons, Path(work)))
        check = None
        files: dict[str, list[str]] = {"ours": [], "upstream": []}
        for r in every_run:
            if r.mode == "process" and r.groups_file and Path(r.groups_file).exists():
                files[r.runtime].append(r.groups_file)
        if files["ours"] and files["upstream"]:
            check = same_work(files["ours"], files["upstream"])
    return {
        "command": [Path(sys.executable).name, *sys.argv],
        **context,
        "workload": asdict(w),
        "repeat": args.repeat,
        "same_work": check,
        "all_runs": [asdict(r) for r in every_run],
    }


def load_run(doc: dict[str, Any]) -> RunResult:
    """A run from a report's JSON (the summary keys next to the fields are dropped)."""
    names = {f.name for f in dataclasses.fields(RunResult)}
    return RunResult(**{k: v for k, v in doc.items() if k in names})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    w = Workload(
        group_size=args.group_size,
        latency=args.latency,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        warmup=args.warmup,
        duration=args.duration,
        start_timeout=args.start_timeout,
    )
    w.check()
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.report is not None:
        doc = json.loads(args.report.read_text())
        console.log(f"report of {args.report}: {doc['command']}, code {doc['code']}")
    else:
        console.log(f"machine: {machine()}")
        console.log(f"code: {code_version()}")
        console.log(f"workload: {asdict(w)}")
        doc = measure(args, w, console)
    every_run = [load_run(r) for r in doc["all_runs"]]
    repeat, check = int(doc.get("repeat", 1)), doc.get("same_work")
    if check is not None:
        console.log(
            f"same work: {check['identical']} of {check['groups_compared']} of our groups are"
            " identical (tokens, masks, inference logprobs, scores) to upstream's group for the"
            " same prompt"
        )
    results = least_disturbed(every_run)
    for table in rich_tables(results, args.target_pct, args.target_ratio, every_run):
        console.print(table)
    if repeat > 1:
        spread = Table(title=f"Spread over {repeat} repeats")
        for i, h in enumerate(SPREAD_HEADERS):
            spread.add_column(h, justify="left" if i < 3 else "right")
        for cells in spread_rows(every_run):
            spread.add_row(*cells)
        console.print(spread)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {
            **{k: v for k, v in doc.items() if k != "all_runs"},
            "targets": {"pct_of_ideal": args.target_pct, "cpu_ratio": args.target_ratio},
            "runs": [{**asdict(r), **r.summary()} for r in results],
            "cpu_comparison": [
                {
                    "mode": row["ours"].mode,
                    "ours": [row["ours"].mode, row["ours"].workers],
                    "upstream": [row["upstream"].mode, row["upstream"].workers],
                    "ours_env_cpu_us_per_rollout_median": row["ours_us"],
                    "upstream_env_cpu_us_per_rollout_median": row["upstream_us"],
                    "runs": row["runs"],
                    "ratio": row["ratio"],
                    "met": row["met"],
                }
                for row in cpu_rows(results, args.target_ratio, every_run)
            ],
            "all_runs": [{**asdict(r), **r.summary()} for r in every_run],
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        console.log(f"wrote {args.json}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        text = markdown(results, args.target_pct, args.target_ratio, every_run)
        if repeat > 1:
            text += (
                f"\nSpread over {repeat} repeats (the tables above show each configuration's"
                " least disturbed run):\n\n"
            )
            text += _md(SPREAD_HEADERS, spread_rows(every_run))
        if check is not None:
            text += (
                f"\nSame work: {check['identical']} of {check['groups_compared']} of our process"
                " groups are identical (tokens, masks, inference logprobs, scores) to upstream's"
                " group for the same prompt.\n"
            )
        args.markdown.write_text(text)
        console.log(f"wrote {args.markdown}")
    return 0


def upstream_python() -> str:
    """The python of the upstream venv (full: made on first use)."""
    return _upstream_python("full")


if __name__ == "__main__":
    sys.exit(main())
