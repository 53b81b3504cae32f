"""The local backend: every process of the plan on this machine, one supervisor each.

Ports the run file leaves open are picked here (free now on the bind address), so `--dry-run`
shows the real URLs. GPUs, when processes ask for them, are handed out in plan order as
`CUDA_VISIBLE_DEVICES` from `$CUDA_VISIBLE_DEVICES` (or 0..N-1 as `nvidia-smi` counts them); a
plan that asks for more than the machine has is refused before anything starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from rich.console import Console

from atropos.launch.driver import drive
from atropos.launch.keys import run_key, write_private
from atropos.launch.plan import Book, Plan
from atropos.launch.supervise import LISTENS, Supervisor, free_port


class PlacementError(ValueError):
    """The plan cannot be placed on this machine."""


def place(plan: Plan, strict: bool = True) -> Plan:
    """`plan` with ports picked and GPUs assigned for this machine; with `strict` False, a
    shortage of GPUs leaves them unassigned instead of failing (for `--dry-run`)."""
    plan = plan.model_copy(deep=True)
    missing = missing_pythons(plan)
    if missing and strict:
        raise PlacementError("; ".join(missing))
    for proc in plan.processes:
        if proc.role in LISTENS and not proc.host:
            proc.host = "127.0.0.1"
        if proc.role in LISTENS and not proc.port:
            try:
                proc.port = free_port(proc.host)
            except OSError as err:
                raise PlacementError(
                    f"{proc.name}: cannot listen on {proc.host} here ({err.strerror or err});"
                    " give an address of this machine as its host"
                ) from None
    wanted = sum(p.gpus for p in plan.processes)
    if wanted:
        gpus = visible_gpus()
        if wanted > len(gpus) and not strict:
            return plan
        if wanted > len(gpus):
            asks = ", ".join(f"{p.name} {p.gpus}" for p in plan.processes if p.gpus)
            raise PlacementError(
                f"the run asks for {wanted} GPUs ({asks}) and this machine has {len(gpus)};"
                " lower the gpus: of its processes, or run it with backend ray or slurm"
            )
        for proc in plan.processes:
            proc.gpu_ids, gpus = gpus[: proc.gpus], gpus[proc.gpus :]
    return plan


def missing_pythons(plan: Plan) -> list[str]:
    """One line per process whose own interpreter (an inference server's `python:`) is not
    an executable here: a path that is not there, or a bare name not on PATH."""
    lines: list[str] = []
    seen: set[str] = set()
    for proc in plan.processes:
        python = proc.python
        if not python or python in seen:
            continue
        seen.add(python)
        found = shutil.which(python) if os.sep not in python else python
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            lines.append(
                f"{proc.name}: python: no Python at {python} (the run file's python: of this"
                " server names the interpreter of its command, e.g. .../vllm-venv/bin/python)"
            )
    return lines


def visible_gpus() -> list[int]:
    """GPU indices this machine offers: `$CUDA_VISIBLE_DEVICES`, else what nvidia-smi lists."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [int(x) for x in given.split(",") if x.strip().isdigit()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(x) for x in out.split() if x.isdigit()]


def book_of(plan: Plan) -> Book:
    """Where each listening process will be reached (its ports are known once placed)."""
    book = Book()
    for proc in plan.processes:
        if proc.role in LISTENS and proc.port:
            host = "127.0.0.1" if proc.host in ("0.0.0.0", "::", "") else proc.host
            book[proc.name] = (host, proc.port)
    return book


def write_plan(plan: Plan) -> None:
    """`RUN_DIR/plan.json`, readable by its owner only (it holds no secret value, but the
    run's command lines and environment)."""
    write_private(plan.run_dir / "plan.json", plan.model_dump_json(indent=2))


def run(plan: Plan, console: Console | None = None, live: bool | None = None) -> int:
    """Run the (placed) plan here; the run's exit status."""
    key = run_key(plan)
    book = book_of(plan)
    handles = {
        proc.name: Supervisor(
            proc,
            run_dir=plan.run_dir,
            book=book,
            python=sys.executable,
            key=key,
            secrets=plan.secrets(proc.name),  # in memory: this process starts them all
        )
        for proc in plan.processes
    }
    placements = {p.name: {"host": "localhost", "gpus": p.gpu_ids or []} for p in plan.processes}
    return drive(plan, handles, key=key, console=console, live=live, placements=lambda: placements)
