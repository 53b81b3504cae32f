"""The single-node Slurm cluster of `atropos.testing.slurm`: it starts twice in a row and leaves
no process behind, `sbatch --wait` runs a job whose `srun` step prints the host name, two steps of
one job run at the same time (`srun --overlap`, or `srun --exact` in a job with enough CPUs), and
`scancel` ends a running job and its task.

Without Slurm installed (or without root) these tests skip with the install hint, except under CI
(`CI` set), where they fail: there `make test` must have installed the packages.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from atropos.testing.slurm import (
    SlurmCluster,
    SlurmUnavailable,
    short_hostname,
    slurm_unavailable_reason,
)

from .runs import require


def require_slurm() -> None:
    require(slurm_unavailable_reason())


def wait_until(what: str, ready: Callable[[], bool], deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not ready():
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline:.0f} s for {what}")
        time.sleep(0.05)


def job_state(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, ExitCode, ...)."""
    shown = cluster.run(["scontrol", "show", "job", "--oneliner", job_id])
    assert shown.returncode == 0, shown.stderr
    return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def has_text(path: Path) -> bool:
    return path.exists() and path.read_text().strip() != ""


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\nset -eu\n" + body)
    return path


# First in the file, before the module's cluster exists: a cluster of its own, stopped with a job
# still running, and then (by the `cluster` fixture) started again in the same session, from a
# fresh directory.
def test_cluster_stops_without_leftovers_and_starts_again(tmp_path: Path) -> None:
    require_slurm()
    pid_file = tmp_path / "task.pid"
    with SlurmCluster(tmp_path / "first") as cluster:
        daemon_pids = {name: p.pid for name, p in cluster.processes.items()}
        assert set(daemon_pids) == {"munged", "slurmctld", "slurmd"}
        step = cluster.run(["srun", "--ntasks=1", "hostname"])
        assert step.returncode == 0, step.stderr
        assert step.stdout.strip() == short_hostname()
        long_job = f"srun --ntasks=1 bash -c 'echo $$ > {pid_file}; exec sleep 300'"
        submitted = cluster.run(["sbatch", f"--output={tmp_path / 'long.out'}", "--wrap", long_job])
        assert submitted.returncode == 0, submitted.stderr
        wait_until("the job's task to write its pid", lambda: has_text(pid_file))
    task_pid = int(pid_file.read_text())
    ps = subprocess.run(["ps", "-eo", "pid="], capture_output=True, text=True, check=True)
    running = {int(pid) for pid in ps.stdout.split()}
    assert not running & {*daemon_pids.values(), task_pid}, f"still running: {ps.stdout}"
    assert cluster.leftover_pids() == []


def test_missing_binaries_raise_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmUnavailable, match="make test"):
        SlurmCluster(tmp_path / "cluster").start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running
    assert running.leftover_pids() == []


def test_sbatch_wait_runs_an_srun_step(cluster: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(tmp_path / "job.sh", "srun --ntasks=1 hostname\n")
    output = tmp_path / "job.out"
    submitted = cluster.run(
        ["sbatch", "--wait", "--parsable", f"--output={output}", str(script)], timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    assert output.read_text().strip() == short_hostname()
    state = job_state(cluster, submitted.stdout.strip())
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0")


# Each step touches its own marker, then waits for the other's: both exit 0 only if they ran at
# the same time (plain `srun` would run the second step after the first, which then times out).
STEP = 'touch "$1"; for _ in $(seq 200); do [ -e "$2" ] && exit 0; sleep 0.1; done; exit 1'


@pytest.mark.parametrize(("flags", "ntasks"), [("--overlap", 1), ("--exact", 2)])
def test_two_steps_of_one_job_run_concurrently(
    cluster: SlurmCluster, tmp_path: Path, flags: str, ntasks: int
) -> None:
    if (os.cpu_count() or 1) < ntasks:
        pytest.skip(f"{flags} needs a job of {ntasks} CPUs; this machine has {os.cpu_count()}")
    a, b = tmp_path / "a", tmp_path / "b"
    body = (
        f"srun --ntasks=1 {flags} bash -c '{STEP}' _ {a} {b} & first=$!\n"
        f"srun --ntasks=1 {flags} bash -c '{STEP}' _ {b} {a} & second=$!\n"
        'wait "$first"\nwait "$second"\n'
    )
    script = write_script(tmp_path / "steps.sh", body)
    output = tmp_path / "steps.out"
    submitted = cluster.run(
        ["sbatch", "--wait", f"--ntasks={ntasks}", f"--output={output}", str(script)], timeout=60
    )
    assert submitted.returncode == 0, output.read_text()
    assert a.exists() and b.exists()


def test_scancel_ends_a_running_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "task.pid"
    script = write_script(
        tmp_path / "long.sh", f"srun --ntasks=1 bash -c 'echo $$ > {pid_file}; exec sleep 300'\n"
    )
    submitted = cluster.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'long.out'}", str(script)]
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    wait_until(
        "the job's task to write its pid",
        lambda: has_text(pid_file),
    )
    task_pid = int(pid_file.read_text())
    assert job_state(cluster, job_id)["JobState"] == "RUNNING"

    cancelled = cluster.run(["scancel", job_id])
    assert cancelled.returncode == 0, cancelled.stderr
    wait_until(
        f"job {job_id} to be CANCELLED",
        lambda: job_state(cluster, job_id)["JobState"] == "CANCELLED",
    )
    wait_until(f"the task (pid {task_pid}) to exit", lambda: not pid_alive(task_pid))
