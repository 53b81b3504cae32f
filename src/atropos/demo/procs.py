"""Separate processes for the demo: start each with its own log, wait for health, stop in order.

Each service runs in its own process group, so stopping it (SIGTERM, then SIGKILL after a grace
period) reaches whatever it started and nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


class ServiceError(RuntimeError):
    """A service exited early or never became healthy; the message ends with its log's tail."""


def wait_until_up(url: str, deadline: float = 30.0, service: Service | None = None) -> None:
    """Poll `url` until it answers 200, or raise after `deadline` seconds.

    With a `service`, give up as soon as its process has exited (its log tail is in the error).
    """
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if service is not None and not service.alive():
            raise ServiceError(f"{service.name} exited with {service.returncode}{service.tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    where = service.tail() if service is not None else ""
    raise TimeoutError(f"{url} did not answer within {deadline:.0f} s{where}")


class Service:
    """One child process (`python -m atropos ...` or any argv) logging to `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name, self.argv, self.log_path = name, list(argv), log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False  # stop() had to SIGKILL it: it did not shut down in time

    @classmethod
    def atropos(cls, name: str, args: Sequence[str], log_path: Path) -> Service:
        """`python -m atropos ARGS` with this interpreter."""
        return cls(name, [sys.executable, "-m", "atropos", *args], log_path)

    def start(self, extra_env: dict[str, str] | None = None) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; the exit code.

        A server that shut down gracefully on SIGTERM may still report -15 (uvicorn re-raises
        the signal it caught); `killed` tells whether the grace period ran out.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        return self.proc.returncode

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- last lines of {self.log_path} ---\n" + "\n".join(text)
