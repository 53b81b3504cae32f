"""Inside a Slurm job of `atropos launch`: what the sbatch script's steps and checks run.

- `step(run_dir, name)` (`atropos launch --step NAME RUN_DIR`, one srun step): runs one
  `Supervisor` for process NAME of `RUN_DIR/plan.json`, the same supervisor as on every backend,
  and keeps its state in `RUN_DIR/status/NAME.json` (rewritten on every change). Its address
  book comes from the script's `ATROPOS_ADDR_<NAME>` variables (`HOST:PORT`), its key from
  `RUN_DIR/api.key`. Asked to stop (the word `stop` in `RUN_DIR/status/NAME.control`, which
  the script writes; read twice a second) it stops the process (SIGTERM to its group, SIGKILL
  after the grace period) and exits 0. On SIGTERM or SIGINT (a plain `scancel`, which Slurm
  delivers to every process of the step) it does the same and exits 128 + the signal; a
  second signal kills the process at once. When the process ends by itself the step exits 0
  if it exited 0 (state `exited`), else with its last exit code (1 if that was 0).
- `await_ready(run_dir, names)` (`--await RUN_DIR NAME...`): waits until each named process is
  ready by its status file; exit 1 naming the one that failed, or that missed its deadline (its
  `ready_timeout` from its latest start, plus its restart backoff and some slack).
- `record(run_dir, exit_code)` (`--record RUN_DIR [--exit-code N]`): writes
  `RUN_DIR/launch.json` as the other backends do (`driver.Record`), from the status files, with
  each process's node, the job id and node list, and the API's last `/stats`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx

from atropos.launch.driver import Record
from atropos.launch.keys import KEY_FILE, read_secrets
from atropos.launch.plan import Book, Plan
from atropos.launch.sbatch import NODES_VARIABLE, address_variable
from atropos.launch.supervise import LISTENS, Status, Supervisor

START_DEADLINE = 180.0  # seconds a step has to write its first status (srun, Python, imports)
READY_SLACK = 30.0  # beyond a process's ready_timeout and restart backoff
POLL = 0.5
DONE = ("exited", "failed", "stopped")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class JobError(RuntimeError):
    """Something the job side cannot go on without (a missing plan, variable or key)."""


def load_plan(run_dir: Path) -> Plan:
    path = run_dir / "plan.json"
    try:
        return Plan.model_validate_json(path.read_text())
    except OSError as err:
        raise JobError(
            f"cannot read {path} ({err.strerror}): is {run_dir} the run directory of a"
            " submitted Slurm run, shared with every node?"
        ) from None


def status_path(run_dir: Path, name: str) -> Path:
    return run_dir / "status" / f"{name}.json"


def control_path(run_dir: Path, name: str) -> Path:
    return run_dir / "status" / f"{name}.control"


def stop_asked(path: Path) -> bool:
    """Whether the script asked the step to stop. The file is written in place (never
    renamed), so a fresh open sees the script's write on a shared file system too."""
    try:
        with path.open() as f:
            return "stop" in f.read()
    except OSError:
        return False


def read_status(run_dir: Path, name: str) -> dict[str, Any] | None:
    """Process `name`'s last status as written by its step, None before its first."""
    try:
        doc = json.loads(status_path(run_dir, name).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def as_status(doc: Mapping[str, Any]) -> Status:
    """A status file's fields as a `Status` (its extra fields left out)."""
    values: dict[str, Any] = {f.name: doc.get(f.name) for f in fields(Status)}
    return Status(**values)


def address_book(plan: Plan, environ: Mapping[str, str]) -> Book:
    """Where each listening process is reached, from the script's `ATROPOS_ADDR_*`."""
    book = Book()
    for proc in plan.processes:
        if proc.role not in LISTENS:
            continue
        variable = address_variable(proc.name)
        value = environ.get(variable, "")
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            raise JobError(
                f"{variable} is {value!r}, expected HOST:PORT: run steps from the run's"
                " job.sbatch, which sets it"
            )
        book[proc.name] = (host.strip("[]"), int(port))
    return book


def read_key(run_dir: Path) -> str | None:
    path = run_dir / KEY_FILE
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def gpu_environ(positions: list[int] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` for a process given GPU `positions` among the node's GPUs that
    the step sees (Slurm's `CUDA_VISIBLE_DEVICES` for the step, else 0..N-1).

    >>> gpu_environ([2, 3], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    {'CUDA_VISIBLE_DEVICES': '6,7'}
    """
    if not positions:
        return {}
    seen = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not seen:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, positions))}
    if max(positions) >= len(seen):
        raise JobError(
            f"the process needs GPUs {positions} of its node but the step sees"
            f" {len(seen)} ({','.join(seen)}): check run.slurm.gpus_per_node"
        )
    return {"CUDA_VISIBLE_DEVICES": ",".join(seen[i] for i in positions)}


# ----- --step ------------------------------------------------------------------------------------


class StatusFile:
    """`RUN_DIR/status/NAME.json`: a supervisor's status plus where it runs, written whole."""

    def __init__(self, path: Path, extra: Mapping[str, Any]) -> None:
        self.path, self.extra = path, dict(extra)
        self.last: dict[str, Any] | None = None

    def write(self, status: Status) -> None:
        doc = {**status.as_dict(), **self.extra}
        if doc == self.last:
            return
        self.last = doc
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({**doc, "updated": time.time()}, indent=1))
        tmp.replace(self.path)


def step(run_dir: Path, name: str) -> int:
    """Supervise process `name` of the run in `run_dir` until it is done or stopped (module
    docstring); the step's exit status.

    Long because the step's phases (find the process, publish its address, run, supervise) share the
    plan, the address book and the process, in order.
    """
    run_dir = run_dir.resolve()
    plan = load_plan(run_dir)
    try:
        proc = plan.get(name)
    except KeyError:
        known = ", ".join(p.name for p in plan.processes)
        raise JobError(f"the run has no process {name!r}; it has {known}") from None
    book = address_book(plan, os.environ)
    node = node_name()
    advertise = book[name][0] if name in book else node
    extra_environ = gpu_environ(proc.gpu_ids, os.environ)
    proc = proc.model_copy(update={"gpu_ids": None})  # the positions are mapped above
    supervisor = Supervisor(
        proc,
        run_dir=run_dir,
        book=book,
        python=sys.executable,
        key=read_key(run_dir),
        secrets=read_secrets(run_dir, name),
        advertise=advertise,
        extra_environ=extra_environ,
    )
    job_step = f"{os.environ.get('SLURM_JOB_ID', '?')}.{os.environ.get('SLURM_STEP_ID', '?')}"
    extra = {"node": node, "node_index": proc.node, "gpus": extra_environ, "step": job_step}
    status = StatusFile(status_path(run_dir, name), extra)
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    control = control_path(run_dir, name)
    control.parent.mkdir(parents=True, exist_ok=True)
    control.open("a").close()  # the script writes "stop" into it; never truncated here
    status.write(supervisor.status())
    supervisor.begin()
    stopper: threading.Thread | None = None
    asked = hurried = False
    while True:
        asked = asked or stop_asked(control)
        if (received or asked) and stopper is None and not supervisor.done:
            stopper = threading.Thread(target=supervisor.stop, name="stop", daemon=True)
            stopper.start()
        if len(received) > 1 and stopper is not None and stopper.is_alive() and not hurried:
            hurried = True
            supervisor.stop(0)  # a second signal: no grace
        if supervisor.done and (stopper is None or not stopper.is_alive()):
            break
        supervisor.changed.wait(POLL)
        supervisor.changed.clear()
        status.write(supervisor.status())
    final = supervisor.status()
    status.write(final)
    if final.state == "failed":
        print(f"[launch] {name}: failed: {final.reason}", flush=True)
    if received and final.state == "stopped":
        return 128 + received[0]
    if final.state == "exited" or (asked and final.state == "stopped"):
        return 0
    return final.exit_code or 1


# ----- --await -----------------------------------------------------------------------------------


def await_ready(run_dir: Path, names: list[str]) -> int:
    """Wait until every process in `names` is ready (module docstring); 0, or 1 with why."""
    run_dir = run_dir.resolve()
    plan = load_plan(run_dir)
    procs = {}
    for name in names:
        try:
            procs[name] = plan.get(name)
        except KeyError:
            print(f"[launch] error: the run has no process {name!r}", flush=True)
            return 1
    began = time.time()
    pending = list(names)
    while pending:
        now = time.time()
        for name in list(pending):
            proc, doc = procs[name], read_status(run_dir, name)
            if doc is None:
                if now > began + START_DEADLINE:
                    print(
                        f"[launch] error: {name} did not come up: its step wrote no status"
                        f" ({status_path(run_dir, name)}) within {START_DEADLINE:g} s; see the"
                        " step's errors in this job's output",
                        flush=True,
                    )
                    return 1
                continue
            state = doc.get("state")
            if state == "ready":
                where = f" at {doc['host']}:{doc['port']}" if doc.get("port") else ""
                print(f"[launch] {name}: ready on {doc.get('node')}{where}", flush=True)
                pending.remove(name)
                continue
            if state in DONE:
                reason = doc.get("reason") or f"{name} ended ({state}) before the run started"
                print(f"[launch] error: {name} did not come up: {reason}", flush=True)
                return 1
            started = max(began, float(doc.get("started") or 0))
            deadline = started + proc.ready_timeout + proc.restart.backoff_max + READY_SLACK
            if now > deadline:
                print(
                    f"[launch] error: {name} did not come up: waited {now - began:.0f} s for it"
                    f" to become ready (ready_timeout {proc.ready_timeout:g} s); its state is"
                    f" {state}; see {doc.get('log')}",
                    flush=True,
                )
                return 1
        if pending:
            time.sleep(POLL)
    return 0


# ----- --record ----------------------------------------------------------------------------------


def _api_stats(plan: Plan, run_dir: Path) -> dict[str, Any] | None:
    try:
        host, port = address_book(plan, os.environ).get("api", ("", 0))
    except JobError:
        return None
    if not host:
        return None
    key = read_key(run_dir)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        doc = httpx.get(f"http://{host}:{port}/stats", headers=headers, timeout=2.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def record(run_dir: Path, exit_code: int | None = None) -> int:
    """Write `RUN_DIR/launch.json` (module docstring); 0."""
    run_dir = run_dir.resolve()
    plan = load_plan(run_dir)
    job_id = os.environ.get("SLURM_JOB_ID")
    try:
        previous = json.loads((run_dir / "launch.json").read_text())
    except (OSError, ValueError):
        previous = {}
    if not isinstance(previous, dict) or previous.get("job_id") != job_id:
        previous = {}
    docs = {p.name: read_status(run_dir, p.name) for p in plan.processes}
    statuses = [as_status(doc) for doc in docs.values() if doc is not None]
    placements = {
        name: {k: doc.get(k) for k in ("node", "node_index", "gpus", "step")}
        for name, doc in docs.items()
        if doc is not None
    }
    nodes = os.environ.get(NODES_VARIABLE, "").split()
    extra = {
        "job_id": job_id,
        "nodes": nodes,
        "nodelist": os.environ.get("SLURM_JOB_NODELIST"),
    }
    entry = Record(plan, extra)
    entry.started = float(previous.get("started") or time.time())
    entry.api_stats = _api_stats(plan, run_dir) or previous.get("api_stats")
    entry.exit_code = exit_code
    failed = [s for s in statuses if s.state == "failed"]
    if failed:
        entry.error = failed[0].reason.split("\n", 1)[0]
    entry.write(statuses, placements)
    return 0


def main(action: str, run_dir: Path, names: list[str], exit_code: int | None = None) -> int:
    """`atropos launch --step/--await/--record`; errors are one line, exit status 1."""
    try:
        if action == "step":
            return step(run_dir, names[0])
        if action == "await":
            return await_ready(run_dir, names)
        return record(run_dir, exit_code)
    except JobError as err:
        print(f"[launch] error: {err}", file=sys.stderr, flush=True)
        return 1
