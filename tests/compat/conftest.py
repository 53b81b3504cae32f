"""Shared fixtures for the wire-compatibility tests against atroposlib 0.4.0.

Upstream code only ever runs in its own virtualenvs (`scripts/upstream_venv.py`), as a
subprocess; nothing of it is imported here. Every server a test starts is stopped by it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Run in the upstream venvs only: importing them here (pytest's --doctest-modules would) fails.
collect_ignore = ["upstream_driver.py", "upstream_probe.py"]

ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = Path(__file__).resolve().parent
UPSTREAM_VENV_SCRIPT = ROOT / "scripts" / "upstream_venv.py"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int, family: socket.AddressFamily = socket.AF_INET) -> bool:
    """Whether `host:port` can be bound now (False if in use; True if the family is missing)."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as err:
        import errno

        return err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
    return True


def http_get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """GET `url`; return (status, parsed JSON or text). Raises OSError if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class Server:
    """A server process a test started."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate `proc` (and its session), killing it if it does not exit in 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def serve(
    cmd: list[str], port: int, log: Path, ready_path: str, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """Start `cmd` (a server on 127.0.0.1:`port`), wait until `ready_path` answers 200, stop it."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    server = Server(url, port, proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {proc.returncode} before answering:"
                    f" {' '.join(cmd)}\n{server.log_text()}"
                )
            with contextlib.suppress(OSError):
                if http_get(url + ready_path, timeout=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"server did not answer {ready_path} in 30 s\n{server.log_text()}"
                )
            time.sleep(0.1)
        yield server
    finally:
        stop(proc)


def our_server_cmd(port: int, store: str = "memory", host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "atropos",
        "api",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--store",
        store,
    ]


@contextlib.contextmanager
def run_our_server(
    log_dir: Path, port: int | None = None, store: str = "memory", host: str = "127.0.0.1"
) -> Iterator[Server]:
    """Our API (`python -m atropos api serve`) on `port` (a free one by default)."""
    port = port or free_port()
    with serve(
        our_server_cmd(port, store, host), port, log_dir / f"ours-{port}.log", "/health"
    ) as s:
        yield s


@pytest.fixture
def our_server(tmp_path: Path) -> Iterator[Server]:
    """Our API with an in-memory store on a free port of 127.0.0.1."""
    with run_our_server(tmp_path) as server:
        yield server


def upstream_env(**extra: str) -> dict[str, str]:
    """Environment for upstream subprocesses: offline, no W&B, no proxy for local servers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="disabled",
        PYTHONDONTWRITEBYTECODE="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    env.update(extra)
    return env


_UPSTREAM_PYTHONS: dict[str, Path] = {}


@pytest.fixture(scope="session")
def upstream_python(pytestconfig: pytest.Config) -> Callable[[str], Path]:
    """`upstream_python("light" | "full")`: the python of the cached upstream venv.

    The first call of a session that lacks the venv builds it (the full one takes ~2 min);
    progress goes to the terminal's stderr even under pytest's capture.
    """
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")

    def get(flavour: str) -> Path:
        if flavour in _UPSTREAM_PYTHONS:
            return _UPSTREAM_PYTHONS[flavour]
        quiet = contextlib.nullcontext()
        uncaptured = capman.global_and_fixture_disabled() if capman is not None else quiet
        with uncaptured:
            print(
                f"\n[compat] upstream atroposlib venv ({flavour}): checking, building if missing"
                " (cached under .cache/) ...",
                file=sys.stderr,
                flush=True,
            )
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, str(UPSTREAM_VENV_SCRIPT), flavour],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                timeout=1500,
            )
            print(
                f"[compat] upstream venv ({flavour}) ready in {time.monotonic() - started:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines or not Path(lines[-1]).exists():
            why = (
                f"could not build the upstream atroposlib 0.4.0 venv ({flavour}); pip needs the"
                f" package index (exit {done.returncode}; its output is on stderr above)"
            )
            if os.environ.get("CI"):  # CI has the index: a skip there would hide a broken lock
                pytest.fail(why)
            pytest.skip(why)
        python = Path(lines[-1])
        _UPSTREAM_PYTHONS[flavour] = python
        return python

    return get
