"""A real inference server (vLLM, SGLang) started from its own venv for tests, stopped by pid.

`ServerProcess` is what `atropos.testing.vllm.VLLMServer` and `atropos.testing.sglang.
SGLangServer` share: a free port on 127.0.0.1, the program in its own session and process group
with its output in a log, ready once `GET /health` answers 200 and `GET /v1/models` lists the
served name (within a deadline; the log's tail quoted otherwise), and a stop by pid: SIGTERM to
the group, SIGKILL after `stop_grace` s, then any process left that carries this server's marker
in its environment. A subclass says the command line and the environment. Linux only (/proc).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TypeVar

from atropos.net import free_port
from atropos.testing.proc import (
    Listener,
    Process,
    descendants,
    environ_has,
    kill_strays,
    listeners,
    live_processes,
    stop_group,
)
from atropos.tiny import tokenizer_path

__all__ = ["ServerProcess", "tiny_policy_path"]

_S = TypeVar("_S", bound="ServerProcess")


def tiny_policy_path() -> Path:
    """The shipped tiny policy's folder (`atropos.tiny.warmstart.policy_path()`, without
    importing the warm start)."""
    return Path(tokenizer_path()).parent / "policy"


class ServerProcess:
    """An OpenAI-compatible server program on 127.0.0.1, started on enter (or `start()`),
    stopped on exit (or `stop()`); subclasses give `command()` and `environ()`.

    Args:
        python: the interpreter of the server's venv.
        base_dir: where the log (`{log_name}-PORT.log`) and the server's caches go.
        served_model_name: the name requests use, which readiness waits for.
        start_timeout: seconds the start may take until ready.
        stop_grace: seconds between SIGTERM and SIGKILL (and for the strays after).
    """

    label = "server"  # the program's name in messages ("vLLM")
    log_name = "server"  # the log's file name before the port
    marker_key = "ATROPOS_TEST_SERVER"  # in the environment of every process a server starts

    def __init__(
        self,
        python: str | os.PathLike[str],
        base_dir: str | os.PathLike[str],
        *,
        served_model_name: str,
        start_timeout: float,
        stop_grace: float,
    ) -> None:
        self.python = Path(os.path.abspath(python))  # the venv's link, not its target
        self.base_dir = Path(base_dir).resolve()
        self.served_model_name = served_model_name
        self.start_timeout, self.stop_grace = start_timeout, stop_grace
        self.port = free_port()
        self.log_path = self.base_dir / f"{self.log_name}-{self.port}.log"
        self.marker = uuid.uuid4().hex
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None  # seconds from launch to ready
        self.strays: list[Process] = []

    def __repr__(self) -> str:
        state = "running" if self.process is not None else "stopped"
        return f"<{type(self).__name__} {self.served_model_name!r} {self.base_url} {state}>"

    @property
    def root(self) -> str:
        """The server's root URL: `http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: `http://127.0.0.1:PORT/v1`."""
        return self.root + "/v1"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        raise NotImplementedError

    def environ(self) -> dict[str, str]:
        """The server's environment: ours, less our venv, plus the marker (subclasses add)."""
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env[self.marker_key] = self.marker
        return env

    # ---- start

    def __enter__(self: _S) -> _S:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server and return once it is ready (stopped again if it never is).

        Raises:
            RuntimeError: the server exited before it was ready (its log's tail is quoted).
            TimeoutError: not ready within `start_timeout` seconds (its log's tail is quoted).
        """
        if self.process is not None:
            raise RuntimeError(f"{self!r} is already started")
        if not self.python.exists():
            raise FileNotFoundError(f"no {self.label} python at {self.python}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environ(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, which stop() signals
            )
        try:
            self._wait_ready(began + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited (code {self.process.returncode}) before it was ready\n"
                    + self.tail()
                )
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.label} was not ready within {self.start_timeout:g} s\n" + self.tail()
                )
            time.sleep(0.5)

    def ready(self) -> bool:
        """Whether /health answers 200 and /v1/models lists the served name."""
        try:
            with urllib.request.urlopen(self.root + "/health", timeout=5) as answer:
                if answer.status != 200:
                    return False
            with urllib.request.urlopen(self.base_url + "/models", timeout=5) as answer:
                models = json.loads(answer.read())
        except (OSError, ValueError):  # not listening yet, reset, or a half-written answer
            return False
        return any(m.get("id") == self.served_model_name for m in models.get("data", []))

    def tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log, with a heading."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            return f"--- no {self.label} log ({e})"
        return f"--- last lines of {self.log_path}:\n" + "\n".join(text)

    # ---- what runs

    def processes(self) -> list[Process]:
        """Live processes of this server: the launched one, its descendants, and any process
        with this server's marker in its environment."""
        everything = live_processes()
        roots = {self.process.pid} if self.process is not None else set()
        roots |= {p.pid for p in everything if environ_has(p.pid, self.marker_key, self.marker)}
        return descendants(roots, everything)

    def listeners(self) -> list[Listener]:
        """The TCP sockets this server's processes listen on."""
        return listeners({p.pid for p in self.processes()})

    # ---- stop

    def stop(self) -> None:
        """Stop the server's process group, then any process of its left; idempotent.

        Raises:
            RuntimeError: a process of the server survived SIGKILL.
        """
        before = self.processes()
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, self.stop_grace)
        found, left = kill_strays(before, self.processes(), self.stop_grace)
        self.strays.extend(found)
        if left:
            alive = "; ".join(f"{p.pid} {p.cmdline[:200]}" for p in left)
            raise RuntimeError(
                f"processes of the {self.label} test server survived SIGKILL: {alive}"
            )
