"""One process supervisor, the same on every backend: start, readiness, restarts, stop.

A `Supervisor` owns one `Process` of the plan. `begin()` starts a thread that:

1. fills the process's templates from the address book (`plan.fill`), writes its files (0600),
   and starts it in a process group of its own, its output appended to `LOG_DIR/NAME.log`,
   with its environment: the plan's, the run's key (`KEY_VARIABLES`) and its secret values
   (`secrets`, which the plan never holds: see `keys`);
2. polls its readiness gate until it passes (state `ready`), the process exits, or the
   deadline passes (state `failed`, with the log's tail in `reason`);
3. watches it; when it exits, the restart policy decides: `on-failure` restarts after a
   non-zero exit, `always` after any, each time after a backoff that doubles up to a cap, at
   most `max_restarts` times; otherwise the state becomes `exited` (status 0) or `failed`.
   A process that exits with status 2 (a usage error) before it was ever ready is not
   restarted: its command line or configuration is wrong, and the launch fails at once.

`stop(grace)` sends SIGTERM to the process group, waits `grace` seconds, then SIGKILLs that
group only. The local backend runs one supervisor per process in its own process; the Ray
backend runs each inside an actor on the process's node; a Slurm step runs one as its command
(`atropos launch --step NAME RUN_DIR`, `slurm_job.step`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from atropos.launch import ready
from atropos.launch.plan import Process, fill

State = Literal[
    "waiting", "starting", "ready", "restarting", "exited", "failed", "stopping", "stopped"
]
LISTENS = ("api", "inference")
USAGE_ERROR = 2  # the exit status of a command-line or configuration error (every atropos CLI)
POLL = 0.2
WILDCARD = ("0.0.0.0", "::", "")
FOREIGN_PYTHON_DROPS = ("PYTHONPATH", "VIRTUAL_ENV")  # not inherited by a process's own python
KEY_VARIABLES = (
    "ATROPOS_API_KEY",  # the API's own key and the environments' key for it
    "ATROPOS_TRAIN_API_KEY",  # atropos train's key for the API
    "ATROPOS_TRAIN_SERVER_API_KEY",  # atropos train's key for the servers it syncs into
    "ATROPOS_LOCAL_API_KEY",  # atropos local serve's key
    "VLLM_API_KEY",  # vllm serve's key
)


@dataclass
class Status:
    """What a supervisor tells about its process (JSON-able, for views, Ray and launch.json)."""

    name: str
    role: str
    state: State
    restarts: int
    pid: int | None  # the process's id; after it ended, the last one's (None: never started)
    exit_code: int | None
    exit_codes: list[int]
    started: float | None  # wall-clock time of the current start
    ready_after: float | None  # seconds from the first start to the first readiness
    reason: str
    host: str
    port: int | None
    log: str
    argv: list[str]
    alive: bool = False  # whether process `pid` is still running

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Supervisor:
    """Supervise `proc`; see the module docstring."""

    def __init__(
        self,
        proc: Process,
        *,
        run_dir: Path,
        book: MutableMapping[str, tuple[str, int]],
        python: str,
        key: str | None = None,
        log_dir: Path | None = None,
        advertise: str | None = None,
        extra_environ: dict[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.book = book
        self.python = python
        self.key = key
        self.log_path = (log_dir or run_dir / "logs") / f"{proc.name}.log"
        bind = proc.host
        self.advertise = advertise or ("127.0.0.1" if bind in WILDCARD else bind)
        self.extra_environ = dict(extra_environ or {})
        self.secrets = dict(secrets or {})  # its secret environment, never written or shown
        self.state: State = "waiting"
        self.restarts = 0
        self.exit_codes: list[int] = []
        self.reason = ""
        self.argv: list[str] = []
        self.started_wall: float | None = None
        self.ready_after: float | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._first_start: float | None = None
        self._log_start = 0  # where the latest start's output begins in the log
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.changed = threading.Event()  # set on every state change (views, backends)

    # ----- public ------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start the process and its supervision thread; returns at once."""
        self._thread = threading.Thread(target=self._run, name=f"supervise-{self.proc.name}")
        self._thread.daemon = True
        self._thread.start()

    def run(self) -> int:
        """Supervise in this thread until the process is done or stopped; its last exit code."""
        self._run()
        return self.exit_codes[-1] if self.exit_codes else (0 if self.state == "ready" else 1)

    def wait_settled(self, timeout: float) -> State:
        """Wait until the process is ready or finished (exited, failed); the state."""
        end = time.monotonic() + timeout
        while self.state in ("waiting", "starting", "restarting") and time.monotonic() < end:
            self.changed.wait(POLL)
            self.changed.clear()
        return self.state

    @property
    def done(self) -> bool:
        return self.state in ("exited", "failed", "stopped")

    def status(self) -> Status:
        popen = self._popen
        alive = popen is not None and popen.poll() is None
        host, port = self.book.get(self.proc.name, (self.advertise, self.proc.port or 0))
        return Status(
            name=self.proc.name,
            role=self.proc.role,
            state=self.state,
            restarts=self.restarts,
            pid=popen.pid if popen is not None else None,
            exit_code=self.exit_codes[-1] if self.exit_codes else None,
            exit_codes=list(self.exit_codes),
            started=self.started_wall,
            ready_after=self.ready_after,
            reason=self.reason,
            host=host,
            port=port or None,
            log=str(self.log_path),
            argv=list(self.argv),
            alive=alive,
        )

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; the exit code."""
        grace = self.proc.grace if grace is None else grace
        self._stopping.set()
        with self._lock:
            popen = self._popen
            if self.state not in ("exited", "failed", "stopped"):
                self._set("stopping")
        code = _terminate(popen, grace) if popen is not None else None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=grace + 5)
        if self.state == "stopping":
            self._set("stopped")
        return code

    def tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the log, headed by its path."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64_000))
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)

    # ----- the supervision thread ----------------------------------------------------------------

    def _set(self, state: State, reason: str | None = None) -> None:
        self.state = state
        if reason is not None:
            self.reason = reason
        self.changed.set()

    def _run(self) -> None:
        backoff = self.proc.restart.backoff
        while not self._stopping.is_set():
            try:
                self._spawn()
            except (OSError, KeyError, ValueError) as err:
                self._set("failed", f"{self.proc.name} could not start: {err}")
                return
            outcome = self._await_ready()
            if outcome == "stopped":
                break
            if outcome == "ready":
                code = self._watch()
            else:  # "exited" before ready, or "late": the deadline passed
                if outcome == "late":
                    _terminate(self._popen, min(self.proc.grace, 10.0))
                    self._set("failed", self.reason)
                    return
                code = self._exit_code()
            if self._stopping.is_set():
                break
            if not self._restart_allowed(code):
                if code == 0 and outcome == "ready":
                    self._set("exited", f"{self.proc.name} exited with 0")
                else:
                    self._set("failed", self._exit_reason(code, outcome == "ready"))
                return
            self.restarts += 1
            self._set("restarting", f"exited with {code}; restart {self.restarts} in {backoff:g} s")
            if self._stopping.wait(backoff):
                break
            backoff = min(max(backoff * 2, 0.1), self.proc.restart.backoff_max)
        if self.state not in ("exited", "failed"):
            self._set("stopped")

    def _restart_allowed(self, code: int) -> bool:
        policy = self.proc.restart
        if policy.policy == "never" or self.restarts >= policy.max_restarts:
            return False
        if code == USAGE_ERROR and self.ready_after is None:
            return False  # its command line or configuration is wrong: no restart would help
        return policy.policy == "always" or code != 0

    def _exit_reason(self, code: int, was_ready: bool) -> str:
        when = "" if was_ready else " before it was ready"
        restarts = f" after {self.restarts} restarts" if self.restarts else ""
        return f"{self.proc.name} exited with {code}{when}{restarts}\n{self.tail()}"

    def _port(self) -> int | None:
        if self.proc.role not in LISTENS:
            return None
        known = self.book.get(self.proc.name)
        if known is not None:
            return known[1]
        port = self.proc.port or free_port(self.proc.host)
        self.book[self.proc.name] = (self.advertise, port)
        return port

    def _spawn(self) -> None:
        self._port()
        proc, book = self.proc, self.book

        def render(text: str) -> str:
            return fill(
                text,
                proc,
                book,
                python=self.python,
                run_dir=self.run_dir,
                key=self.key,
                secrets=self.secrets,
            )

        for rel, content in proc.files.items():
            path = self.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(render(content))
        argv = [render(part) for part in proc.argv]
        environ = self._environ(render)
        self.gate_url = render(proc.gate.url)
        self.baseline = (
            ready.registrations(self.gate_url, proc.gate.env_key, self.key)
            if proc.gate.kind == "env" and proc.gate.env_key
            else 0
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self._stopping.is_set():
                raise ValueError("stopped before it started")
            with self.log_path.open("ab") as log:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                log.write(f"=== {stamp} start {self.restarts}: {' '.join(argv)}\n".encode())
                log.flush()
                self._log_start = log.tell()
                self._popen = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=environ,
                    cwd=os.getcwd(),
                )
            self.argv = argv
            self.started_wall = time.time()
            if self._first_start is None:
                self._first_start = time.monotonic()
            self._set("starting")

    def _environ(self, render: Callable[[str], str]) -> dict[str, str]:
        """The process's environment: ours, then the plan's, its secrets, the key and GPUs."""
        proc = self.proc
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_environ}
        if proc.python:  # an interpreter of its own (vLLM's venv): not our venv's search path
            for name in FOREIGN_PYTHON_DROPS:
                environ.pop(name, None)
        environ.update({k: render(v) for k, v in proc.environ.items()})
        environ.update({k: render(v) for k, v in self.secrets.items()})  # templates, as above
        if self.key:
            environ.update(dict.fromkeys(KEY_VARIABLES, self.key))
        if proc.gpu_ids is not None:
            environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, proc.gpu_ids))
        return environ

    def _await_ready(self) -> Literal["ready", "exited", "late", "stopped"]:
        deadline = time.monotonic() + self.proc.ready_timeout
        gate = self.proc.gate
        while True:
            if self._stopping.is_set():
                return "stopped"
            if self._popen is not None and self._popen.poll() is not None:
                return "exited"
            if ready.check(gate, self.gate_url, self.key, self.baseline) and self._logged(gate.log):
                if self.ready_after is None and self._first_start is not None:
                    self.ready_after = time.monotonic() - self._first_start
                self._set("ready")
                return "ready"
            if time.monotonic() > deadline:
                self.reason = (
                    f"{self.proc.name} was not ready within {self.proc.ready_timeout:g} s"
                    f" (waited for {ready.describe(gate, self.gate_url)})\n{self.tail()}"
                )
                return "late"
            if self._stopping.wait(POLL):
                return "stopped"

    def _logged(self, text: str | None) -> bool:
        """Whether the log holds `text` since the process's latest start (True without one)."""
        if text is None:
            return True
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_start)
                return text.encode() in f.read()
        except OSError:
            return False

    def _watch(self) -> int:
        assert self._popen is not None
        while not self._stopping.is_set():
            code = self._popen.poll()
            if code is not None:
                return self._exit_code()
            self._stopping.wait(POLL)
        return self._exit_code()

    def _exit_code(self) -> int:
        assert self._popen is not None
        code = self._popen.wait()
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says
        self.exit_codes.append(code)
        return code


def _terminate(popen: subprocess.Popen[bytes] | None, grace: float) -> int | None:
    """SIGTERM `popen`'s process group, SIGKILL it after `grace` seconds; the exit code."""
    if popen is None:
        return None
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    # whatever the group still holds (a child that ignored SIGTERM) goes too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    code = popen.returncode
    return 128 - code if code is not None and code < 0 else code


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` right now."""
    bind = "0.0.0.0" if host in WILDCARD else host
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as s:
        s.bind((bind, 0))
        return int(s.getsockname()[1])
