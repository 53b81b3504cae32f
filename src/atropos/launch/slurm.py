"""The Slurm backend: the run as one sbatch job, submitted and followed from here.

`main(plan, run_file, dry_run=...)`:

1. lays the run out on the job's nodes and writes its script (`sbatch.place`, `sbatch.script`);
   with `--dry-run` it prints the script and writes nothing (ports are picked on this machine
   each time, as on the local backend);
2. writes `RUN_DIR/plan.json` (0600), `RUN_DIR/job.sbatch` (0700), the run's secret
   environment values (`RUN_DIR/secrets.json`, 0600, read by the steps) and the run's key
   (`RUN_DIR/api.key`, mode 0600: Slurm runs always have one, since their processes listen
   beyond loopback), submits
   with `sbatch --parsable` and keeps the job id in `RUN_DIR/job.json`;
3. follows the job: its state (`scontrol show job`, which needs no accounting storage), then
   the run's progress (each process's state from `RUN_DIR/status/`, the trainer's step from
   its `metrics.jsonl`), until the job ends; the exit status is the run's (`launch.json`), or 1
   when the job ended without one. Ctrl-C detaches: it says how to follow and cancel, exits 0
   and leaves the job running.

`cancel(run_dir)` (`atropos launch --cancel RUN_DIR`): a running job is asked to stop in order
(`scancel --batch --signal=TERM`: SIGTERM to its script alone, which stops trainer,
environments, inference servers and API, each with its grace period); one that has not ended
after the stop's time budget, or that is still pending, gets a plain `scancel`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atropos.launch.config import RunFile
from atropos.launch.keys import run_key, write_private, write_secrets
from atropos.launch.plan import Plan
from atropos.launch.sbatch import SlurmPlanError, place, script, stop_budget
from atropos.launch.slurm_job import read_status

PROG = "atropos launch"
JOB_FILE = "job.json"
SCRIPT_FILE = "job.sbatch"
POLL = 1.0
STEP_EVERY = 5.0  # seconds between two lines about the trainer's step
ENDED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
}  # fmt: skip
Say = Callable[[str], None]


def _say(text: str) -> None:
    print(f"[launch] {text}", flush=True)


def _error(text: str) -> None:
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


class SlurmError(RuntimeError):
    """A Slurm command is missing or refused; the message says which and why."""


def require(program: str) -> None:
    """`SlurmError` unless Slurm's client command `program` is installed."""
    if shutil.which(program) is None:
        raise SlurmError(
            f"{program} not found: backend slurm needs the Slurm client commands (sbatch,"
            " scontrol, scancel); run on a machine of the cluster that has them"
        )


def slurm_command(args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; `SlurmError` when it is not installed or does not answer."""
    require(args[0])
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args)} did not answer within {timeout:g} s") from None


def job_info(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a dict (JobState, Reason, ExitCode, NodeList, ...); None once
    Slurm no longer knows the job (it ended more than MinJobAge ago)."""
    shown = slurm_command(["scontrol", "show", "job", "--oneliner", job_id])
    if shown.returncode != 0:
        if "Invalid job id" in shown.stderr:
            return None
        raise SlurmError(f"scontrol show job {job_id} failed: {shown.stderr.strip()}")
    return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def read_job(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((run_dir / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("job_id") else None


# ----- submit ------------------------------------------------------------------------------------


def main(plan: Plan, run_file: RunFile, *, dry_run: bool) -> int:
    """`atropos launch RUN.yaml` with backend slurm (module docstring); the exit status."""
    python = run_file.run.slurm.python or sys.executable
    try:
        placed = place(plan, run_file)
        text = script(placed, run_file, python=python, cwd=Path.cwd())
    except SlurmPlanError as err:
        for line in err.lines:
            _error(line)
        return 2
    if dry_run:
        print(text, end="")
        return 0
    run_dir = placed.run_dir
    try:
        require("sbatch")  # before anything is written
        running = _running_job(run_dir)
        if running is not None:
            _error(
                f"{run_dir} belongs to job {running}, which is still in the queue: cancel it"
                f" first ({PROG} --cancel {run_dir}) or use another run directory"
            )
            return 1
        job_id = _submit(placed, text)
    except SlurmError as err:
        _error(str(err))
        return 1
    _say(f"submitted job {job_id}: {run_dir / SCRIPT_FILE}")
    return follow(placed, job_id)


def _running_job(run_dir: Path) -> str | None:
    job = read_job(run_dir)
    if job is None:
        return None
    info = job_info(str(job["job_id"]))
    if info is None or info.get("JobState") in ENDED:
        return None
    return str(job["job_id"])


def _submit(plan: Plan, text: str) -> str:
    run_dir = plan.run_dir
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)  # sbatch --output's directory
    (run_dir / "status").mkdir(exist_ok=True)
    for old in (run_dir / "status").glob("*.json"):
        old.unlink()
    write_private(run_dir / "plan.json", plan.model_dump_json(indent=2))
    write_secrets(run_dir, plan.all_secrets())
    run_key(plan, force=True)
    path = run_dir / SCRIPT_FILE
    write_private(path, text, mode=0o700)  # sbatch copies it; only the owner needs to read it
    submitted = slurm_command(["sbatch", "--parsable", str(path)], timeout=60)
    if submitted.returncode != 0:
        raise SlurmError(f"sbatch refused {path}:\n{submitted.stderr.strip()}")
    job_id = submitted.stdout.strip().split(";", 1)[0]
    job = {"job_id": job_id, "submitted": time.time(), "script": str(path), "name": plan.name}
    (run_dir / JOB_FILE).write_text(json.dumps(job, indent=2) + "\n")
    return job_id


# ----- follow ------------------------------------------------------------------------------------


def _metrics_path(plan: Plan) -> Path:
    argv = plan.get("trainer").argv
    if "--out-dir" in argv[:-1]:
        return Path(argv[argv.index("--out-dir") + 1]) / "metrics.jsonl"
    return plan.run_dir / "trainer" / "metrics.jsonl"


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Progress:
    """What changed in the run since the last look: process states, the trainer's step."""

    def __init__(self, plan: Plan, say: Say) -> None:
        self.plan, self.say = plan, say
        self.shown: dict[str, tuple[Any, Any]] = {}
        self.metrics = _metrics_path(plan)
        self.step = 0
        self.step_shown = 0
        self.step_time = 0.0

    def look(self, final: bool = False) -> None:
        for proc in self.plan.processes:
            doc = read_status(self.plan.run_dir, proc.name)
            if doc is None:
                continue
            seen = (doc.get("state"), doc.get("restarts"))
            if self.shown.get(proc.name) == seen or seen[0] == "waiting":
                continue
            self.shown[proc.name] = seen
            extra = ""
            if seen[0] == "ready":
                where = f" at {doc['host']}:{doc['port']}" if doc.get("port") else ""
                extra = f" on {doc.get('node')}{where}"
                extra += f" (restart {seen[1]})" if seen[1] else ""
            elif seen[0] == "restarting":
                extra = f": {str(doc.get('reason', '')).splitlines()[0]}"
            self.say(f"{proc.name}: {seen[0]}{extra}")
        self.step = _count_lines(self.metrics)
        now = time.monotonic()
        if self.step != self.step_shown and (final or now - self.step_time >= STEP_EVERY):
            self.say(f"trainer step {self.step}")
            self.step_shown, self.step_time = self.step, now


def follow(plan: Plan, job_id: str, say: Say = _say) -> int:
    """Follow job `job_id` of `plan` until it ends; the run's exit status (module docstring).
    Ctrl-C (SIGINT) detaches (exit status 0)."""
    run_dir = plan.run_dir
    progress = Progress(plan, say)
    state = None
    detach: list[int] = []
    # a handler of our own: a launch started in the background of a script inherits SIGINT
    # ignored, and Python then raises no KeyboardInterrupt
    old = signal.signal(signal.SIGINT, lambda signum, frame: detach.append(signum))
    try:
        while not detach:
            info = job_info(job_id)
            now_state = info.get("JobState", "?") if info is not None else "gone"
            if now_state != state:
                reason = (info or {}).get("Reason", "None")
                why = f" ({reason})" if now_state == "PENDING" and reason != "None" else ""
                say(f"job {job_id}: {now_state}{why}")
                state = now_state
            progress.look()
            if info is None or now_state in ENDED:
                break
            time.sleep(POLL)
    except SlurmError as err:
        _error(f"{err}; job {job_id} may still run: {PROG} --cancel {run_dir} cancels it")
        return 1
    finally:
        signal.signal(signal.SIGINT, old)
    if detach:
        say(
            f"detached; job {job_id} goes on. Follow it: squeue -j {job_id}; tail -f"
            f" {run_dir / 'logs'}/*.log. Cancel it: {PROG} --cancel {run_dir}"
        )
        return 0
    progress.look(final=True)
    return _outcome(plan, job_id, info, say)


def _outcome(plan: Plan, job_id: str, info: dict[str, str] | None, say: Say) -> int:
    run_dir = plan.run_dir
    output = run_dir / "logs" / f"job-{job_id}.out"
    code = _exit_code(run_dir, job_id)
    if code is None:
        state = (info or {}).get("JobState", "unknown")
        _error(f"job {job_id} ended ({state}) before the run did; its output: {output}")
        print(_tail(output), file=sys.stderr)
        return 1
    for proc in plan.processes:
        doc = read_status(run_dir, proc.name) or {}
        if doc.get("state") == "failed":
            _error(str(doc.get("reason")))
            break
    say(
        f"run ended with exit status {code}; record: {run_dir / 'launch.json'}; job output:"
        f" {output}"
    )
    return int(code)


def _exit_code(run_dir: Path, job_id: str) -> Any:
    """The run's exit status as `launch.json` records it for job `job_id`; None if it does not.

    The record is the run's own (written when it stops); a missing or unreadable one, or one
    from another job, means the job ended before the run could say how.
    """
    try:
        record = json.loads((run_dir / "launch.json").read_text())
    except (OSError, ValueError):
        return None
    return record.get("exit_code") if record.get("job_id") == job_id else None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"({path} is not there)"
    return f"--- last lines of {path} ---\n" + "\n".join(text)


# ----- cancel ------------------------------------------------------------------------------------


def cancel(run_dir: Path, say: Say = _say) -> int:
    """`atropos launch --cancel RUN_DIR` (module docstring); 0 once the job ended."""
    run_dir = run_dir.resolve()
    job = read_job(run_dir)
    if job is None:
        _error(
            f"{run_dir / JOB_FILE} is missing: {run_dir} is not the run directory of a"
            f" submitted Slurm run ({PROG} RUN.yaml with backend: slurm writes it)"
        )
        return 1
    job_id = str(job["job_id"])
    try:
        info = job_info(job_id)
        state = info.get("JobState") if info is not None else None
        if info is None or state in ENDED:
            say(f"job {job_id} already ended ({state or 'no longer known'}); nothing to cancel")
            return 0
        if state != "RUNNING":
            _scancel([job_id])
            say(f"cancelled job {job_id} (it was {state})")
            return 0
        budget = _stop_budget(run_dir)
        _scancel(["--batch", "--signal=TERM", job_id])
        say(
            f"asked job {job_id} to stop: its script stops the trainer, environments, inference"
            f" servers and API in order (up to {budget} s)"
        )
        end = time.monotonic() + budget
        while time.monotonic() < end:
            info = job_info(job_id)
            if info is None or info.get("JobState") in ENDED:
                say(_ended(run_dir, job_id, info))
                return 0
            time.sleep(POLL)
        _scancel([job_id])
        say(f"job {job_id} did not stop within {budget} s: cancelled it with scancel {job_id}")
        return 0
    except SlurmError as err:
        _error(str(err))
        return 1


def _ended(run_dir: Path, job_id: str, info: dict[str, str] | None) -> str:
    state = info.get("JobState", "?") if info is not None else "no longer known"
    code = _exit_code(run_dir, job_id)
    if code is None:
        return f"job {job_id} ended ({state})"
    return (
        f"job {job_id} ended: the run stopped with exit status {code} (Slurm's job state:"
        f" {state}); record: {run_dir / 'launch.json'}"
    )


def _scancel(args: list[str]) -> None:
    done = slurm_command(["scancel", *args])
    if done.returncode != 0:
        raise SlurmError(f"scancel {' '.join(args)} failed: {done.stderr.strip()}")


def _stop_budget(run_dir: Path) -> int:
    try:
        plan = Plan.model_validate_json((run_dir / "plan.json").read_text())
    except (OSError, ValueError):
        return 180
    return stop_budget(plan)
