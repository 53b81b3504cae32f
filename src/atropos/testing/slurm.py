"""A real single-node Slurm cluster for tests: Debian's slurmctld, slurmd and munged, run as
child processes from one directory, with no systemd, no Docker and no system configuration.

>>> slurm_available() in (True, False)
True

`make test` installs the packages (`apt-get install slurmctld slurmd slurm-client munge`; tested
with Debian 12's Slurm 22.05.8 and MUNGE 0.5.15). Use it as a context manager::

    with SlurmCluster(tmp_path) as cluster:
        subprocess.run(["sbatch", "--wait", "job.sh"], env=cluster.environ, check=True)

`cluster.environ` is the environment for every Slurm client (`sbatch`, `srun`, `squeue`,
`scancel`): this process's environment without inherited `SLURM_*`/`SBATCH_*`/`SRUN_*`/`SALLOC_*`
variables, plus `SLURM_CONF=<cluster.conf_path>`. The daemons run as root (slurmd has to start
jobs as their submitting user), so the cluster needs root.

The recipe, what `start()` writes into the directory and runs:

- `munge.key`: 1024 random bytes, mode 0400, the shared secret of this cluster only.
- `munged -F -f --key-file --socket --pid-file --log-file --seed-file`, all in the directory, so
  the system's munged (socket `/run/munge/munge.socket.2`) is never used or touched. `-F` keeps
  it in the foreground as our child. `-f` (force) is needed because munged refuses a socket
  whose ancestor directories are not executable by everyone, and pytest's temporary
  directories are mode 0700; with `-f` it only warns (every client here runs as root).
- `slurm.conf`:
  - `ClusterName`; `SlurmctldHost=<host>(127.0.0.1)` and `NodeName=<host> NodeAddr=127.0.0.1`:
    `<host>` is the short host name (what `slurmd -C` reports), which slurmctld checks it runs
    on; slurmd is also given it with `-N`. Both daemons are reached on 127.0.0.1 only.
  - `CPUs=<os.cpu_count()>` and `RealMemory` at 90 % of the machine's memory: a node that
    reports less than it is configured with is drained, one that reports more is fine.
    `State=UNKNOWN` lets slurmd's registration decide; `ReturnToService=2` makes a node that
    was DOWN usable as soon as it registers with a valid configuration.
  - `PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP`: the one queue.
  - `SlurmctldPort`/`SlurmdPort`: free ports from `atropos.testing.free_port`, so clusters
    never collide with each other or a real Slurm. `CommunicationParameters=NoCtldInAddrAny,
    NoInAddrAny` binds the daemons' (and srun's) sockets to the node's address, 127.0.0.1,
    instead of every interface.
  - `AuthType=auth/munge`, `CredType=cred/munge` and `AuthInfo=socket=<dir>/munge.sock`: the
    man page of slurm.conf(5) for 22.05 says `socket=` names the MUNGE socket "used by
    auth/munge and cred/munge"; no `AuthAltTypes` (no JWT).
  - `StateSaveLocation`, `SlurmdSpoolDir`, `SlurmctldPidFile`, `SlurmdPidFile`,
    `SlurmctldLogFile`, `SlurmdLogFile`: all in the directory, so each cluster starts from
    fresh state. `PlugStackConfig` points at an empty file there instead of
    `/etc/slurm/plugstack.conf`, so no system file is read.
  - `SlurmUser=root`, `SlurmdUser=root`: no `slurm` account needed.
  - `ProctrackType=proctrack/linuxproc` (tracks a job's processes by parent pid) and
    `TaskPlugin=task/none`: no cgroups, which need systemd or a writable cgroup tree.
  - `SelectType=select/cons_tres`, `SelectTypeParameters=CR_Core`: several jobs and steps share
    the node core by core; memory is not a consumable resource, so steps never wait for it.
  - `MpiDefault=none`, `SwitchType=switch/none`, `JobAcctGatherType=jobacct_gather/none`: no
    MPI, interconnect or accounting. (slurmd still logs that it cannot load PMIx; harmless.)
  - `SchedulerParameters=batch_sched_delay=0`: a submitted batch job is scheduled on the next
    tick of slurmctld's one-second background loop instead of up to 3 s later, so a short job
    ends before `sbatch --wait` first looks (2 s after submitting; the next look is 8 s later).
  - `KillWait=3`: a cancelled job gets SIGKILL 3 s after SIGTERM (default 30), so a stuck job
    does not hold up `stop()`. `MailProg=/bin/true` silences the check for a mail program.
- `cgroup.conf` beside slurm.conf (slurmd reads it from that directory): `CgroupPlugin=
  autodetect`, `IgnoreSystemd=yes`, so nothing talks to systemd or dbus should cgroups be used.
- `slurmctld -D -f slurm.conf` and `slurmd -D -f slurm.conf -N <host>`, each in its own process
  group (`-D`: foreground, log copied to `<name>.out`), after munged's socket exists; then
  `sinfo` is polled until the node is `idle` (about 1 s on a 2-core machine), and `sdiag`
  until slurmctld's main scheduler has run once: its first cycle comes about 3 s after
  slurmctld starts, and a batch job submitted before it waits for it. Start takes about 3 s.

`stop()` cancels every job (`scancel`), waits until the queue is empty, sends SIGTERM to each
daemon's process group in reverse order (slurmd, slurmctld, munged) and SIGKILL after a grace
period, then kills anything left that carries this cluster's `SLURM_CONF` in its environment
(slurmd sets it for slurmstepd and every job task, and the daemons get it from us).

Concurrent job steps. In Slurm 22.05 a step gets all of its job's CPUs on each node unless told
otherwise (srun(1), `--exact`: "By default, all non-GRES resources on each node in the step
allocation will be used"), and steps do not share, so two plain `srun` calls inside one job run
one after the other, even in a job with a CPU for each (the second prints "Step creation
temporarily disabled, retrying (Requested nodes are busy)"). With this configuration either
flag runs them at the same time (tests/launch/test_slurm_cluster.py checks both):

- `srun --overlap`: the step shares CPUs with the other steps; works even in a one-CPU job.
- `srun --exact --ntasks=1`: the step takes only the CPUs it asks for; the job must hold enough
  for all concurrent steps (e.g. `sbatch --ntasks=2` for two one-task steps).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from atropos.net import free_port

__all__ = ["SlurmCluster", "SlurmUnavailable", "slurm_available", "slurm_unavailable_reason"]

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scancel", "scontrol", "sdiag")
INSTALL_HINT = (
    "run `make test`, which installs Debian's slurmctld slurmd slurm-client munge "
    "(or as root: apt-get install -y slurmctld slurmd slurm-client munge)"
)
# A unix socket path holds at most 107 bytes; slurmstepd puts "<host>_<job>.<step>" in the spool.
MAX_SOCKET_DIR = 80
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
SBIN = ("/usr/sbin", "/sbin")


class SlurmUnavailable(RuntimeError):
    """Slurm or MUNGE is not installed, or this process is not root."""


def find_program(name: str) -> str | None:
    """The path of `name` on PATH or in /usr/sbin and /sbin (the daemons' home, often not on a
    user's PATH); None when it is not installed."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def missing_binaries() -> list[str]:
    """The Slurm and MUNGE programs the cluster needs that are not installed."""
    return [name for name in (*DAEMONS, *CLIENTS) if find_program(name) is None]


def slurm_available() -> bool:
    """Whether slurmctld, slurmd, munged and the Slurm client commands are installed."""
    return not missing_binaries()


def slurm_unavailable_reason() -> str | None:
    """Why a SlurmCluster cannot start here, or None when it can."""
    missing = missing_binaries()
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): {INSTALL_HINT}"
    if os.geteuid() != 0:
        return (
            "SlurmCluster needs root (slurmd starts jobs as their submitting user): "
            "run the Slurm tests as root"
        )
    return None


def short_hostname() -> str:
    """This host's name as slurmd sees it (`slurmd -C`): up to the first dot."""
    return socket.gethostname().split(".")[0]


def memory_mb() -> int:
    """The machine's physical memory in MiB."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


class SlurmCluster:
    """slurmctld, slurmd and munged for one node, configured and run from `directory`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        cluster_name: str = "atropos-test",
        start_deadline: float = 60.0,
        stop_grace: float = 10.0,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.conf_path = self.directory / "slurm.conf"
        self.cluster_name = cluster_name
        self.hostname = short_hostname()
        self.start_deadline = start_deadline
        self.stop_grace = stop_grace
        self.environ: dict[str, str] = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(INHERITED_PREFIXES)
        }
        self.environ["SLURM_CONF"] = str(self.conf_path)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge.sock"

    def run(
        self, args: Sequence[str], timeout: float = 30.0, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; output is captured as text."""
        return subprocess.run(
            list(args), env=self.environ, capture_output=True, text=True, timeout=timeout, **kwargs
        )

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration, start the daemons and wait until the node is idle."""
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise SlurmUnavailable(reason)
        if self.processes:
            raise RuntimeError(f"the Slurm cluster in {self.directory} is already running")
        if self.conf_path.exists():
            raise RuntimeError(
                f"{self.conf_path} exists: give SlurmCluster a fresh directory for each cluster"
            )
        if len(str(self.directory)) > MAX_SOCKET_DIR:
            raise RuntimeError(
                f"{self.directory} is too long for unix socket paths "
                f"({len(str(self.directory))} > {MAX_SOCKET_DIR} characters): use a shorter one"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_files()
        try:
            self.spawn("munged", self.munged_args())
            self.wait_for(
                "munged to create its socket " + str(self.munge_socket), self.munge_socket.exists
            )
            self.spawn("slurmctld", ["-D", "-f", str(self.conf_path)])
            self.spawn("slurmd", ["-D", "-f", str(self.conf_path), "-N", self.hostname])
            self.wait_for(f"sinfo to report node {self.hostname} idle", self.node_idle)
            self.wait_for("slurmctld's first scheduling cycle (sdiag)", self.scheduler_ran)
        except BaseException:
            self.stop()
            raise

    def write_files(self) -> None:
        d = self.directory
        key = d / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for sub in ("state", "spool"):
            (d / sub).mkdir(mode=0o700)
        (d / "plugstack.conf").write_text("")
        (d / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
        self.conf_path.write_text(self.slurm_conf())

    def slurm_conf(self) -> str:
        """The text of slurm.conf (see the module docstring for what each line is for)."""
        d, host = self.directory, self.hostname
        settings = {
            "ClusterName": self.cluster_name,
            "SlurmctldHost": f"{host}(127.0.0.1)",
            "SlurmctldPort": free_port(),
            "SlurmdPort": free_port(),
            "CommunicationParameters": "NoCtldInAddrAny,NoInAddrAny",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": d / "state",
            "SlurmdSpoolDir": d / "spool",
            "SlurmctldPidFile": d / "slurmctld.pid",
            "SlurmdPidFile": d / "slurmd.pid",
            "SlurmctldLogFile": d / "slurmctld.log",
            "SlurmdLogFile": d / "slurmd.log",
            "PlugStackConfig": d / "plugstack.conf",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "ReturnToService": 2,
            "MpiDefault": "none",
            "SwitchType": "switch/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "SchedulerParameters": "batch_sched_delay=0",
            "KillWait": 3,
            "MailProg": shutil.which("true") or "/bin/true",
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines.append(
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
            f"RealMemory={max(1, memory_mb() * 9 // 10)} State=UNKNOWN"
        )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def munged_args(self) -> list[str]:
        d = self.directory
        return [
            "--foreground",
            "--force",
            f"--key-file={d / 'munge.key'}",
            f"--socket={self.munge_socket}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ]

    def spawn(self, name: str, args: list[str]) -> None:
        """Start daemon `name` in its own process group, its output in `<name>.out`."""
        program = find_program(name)
        if program is None:
            raise SlurmUnavailable(f"{name} is not installed: {INSTALL_HINT}")
        with open(self.directory / f"{name}.out", "wb") as out:
            self.processes[name] = subprocess.Popen(
                [program, *args],
                cwd=self.directory,
                env=self.environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, signalled as a whole
            )

    def node_idle(self) -> bool:
        try:
            result = self.run(["sinfo", "-h", "-N", "-n", self.hostname, "-o", "%T"], timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def scheduler_ran(self) -> bool:
        """Whether `sdiag` counts a main scheduling cycle (the first comes ~3 s after start)."""
        try:
            result = self.run(["sdiag"], timeout=10)
        except subprocess.TimeoutExpired:
            return False
        main = result.stdout.partition("Main schedule statistics")[2].partition("Backfilling")[0]
        match = re.search(r"Total cycles:\s*(\d+)", main)
        return result.returncode == 0 and match is not None and int(match.group(1)) > 0

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll `ready()` until true; fail with the log tails if a daemon exits or time runs out."""
        end = time.monotonic() + self.start_deadline
        while not ready():
            dead = {
                name: p.returncode for name, p in self.processes.items() if p.poll() is not None
            }
            if dead:
                exits = ", ".join(f"{name} exited with {code}" for name, code in dead.items())
                raise RuntimeError(f"waiting for {what}: {exits}\n{self.log_tails()}")
            if time.monotonic() > end:
                raise RuntimeError(
                    f"waited {self.start_deadline:.0f} s for {what}; it did not happen\n"
                    + self.log_tails()
                )
            time.sleep(0.1)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each daemon's output, for error messages."""
        parts = []
        for name in self.processes:
            path = self.directory / f"{name}.out"
            text = path.read_text(errors="replace") if path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:]) or "(empty)"
            parts.append(f"--- {path} (last {lines} lines) ---\n{tail}")
        return "\n".join(parts)

    # -- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel all jobs, stop the daemons (reverse start order) and kill any leftover."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            self.cancel_all_jobs()
        for name in reversed(list(self.processes)):
            self.stop_process(self.processes[name])
        self.processes.clear()
        for pid in self.leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + self.stop_grace
        while self.leftover_pids() and time.monotonic() < end:
            time.sleep(0.05)

    def cancel_all_jobs(self) -> None:
        """scancel every job, then wait (at most `stop_grace` + KillWait) for an empty queue."""
        try:
            end = time.monotonic() + self.stop_grace + 3
            while time.monotonic() < end:
                queue = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
                job_ids = queue.stdout.split()
                if queue.returncode == 0 and not job_ids:
                    return
                if job_ids:
                    self.run(["scancel", *job_ids], timeout=10)
                time.sleep(0.1)
        except subprocess.TimeoutExpired:
            pass  # slurmctld does not answer; the sweep in stop() kills what the jobs left

    def stop_process(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the process group, SIGKILL after `stop_grace`; then reap the process.

        The leader is reaped only after its group got SIGKILL: until then its pid (the group's id)
        cannot be reused, so the signals never reach a stranger.
        """
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            if not self.wait_exit(process.pid, self.stop_grace):
                os.killpg(process.pid, signal.SIGKILL)
                self.wait_exit(process.pid, self.stop_grace)
            with contextlib.suppress(ProcessLookupError):  # e.g. slurmctld's slurmscriptd
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=self.stop_grace)

    @staticmethod
    def wait_exit(pid: int, deadline: float) -> bool:
        """Whether child `pid` exited within `deadline` s; it is left unreaped (a zombie)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            if os.waitid(os.P_PID, pid, flags) is not None:
                return True
            time.sleep(0.02)
        return False

    def leftover_pids(self) -> list[int]:
        """Live processes with this cluster's SLURM_CONF in their environment (daemons, tasks)."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                status = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile, or not ours to read
            if marker in environ.split(b"\0") and status.rsplit(")", 1)[-1].split()[0] != "Z":
                found.append(int(entry.name))
        return found
