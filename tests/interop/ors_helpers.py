"""What the ORS tests share: an ORS environment written with openreward (tests/interop/ors_envs)
served by the interop venv's python, on 127.0.0.1, stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from atropos.net import free_port

ENVS = Path(__file__).resolve().parent / "ors_envs"


def wait_ready(url: str, process: subprocess.Popen[bytes], deadline_s: float = 60.0) -> None:
    """Wait until `url` answers 200 (or fail when the process exits or the deadline passes)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {deadline_s} s")


@contextmanager
def running(
    argv: list[str], ready_path: str, port: int, extra: dict[str, str] | None = None
) -> Iterator[str]:
    """Run `argv` (a server on 127.0.0.1:`port`) until the block ends; yield its base URL."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OPENREWARD_DISABLE_UPDATE_CHECK": "1"}
    env.update(extra or {})
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + ready_path, process)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def ors_env(python: Path, name: str) -> Iterator[str]:
    """The openreward environment `ors_envs/NAME.py` served by `python`; yields its URL."""
    port = free_port()
    with running([str(python), str(ENVS / f"{name}.py"), str(port)], "/health", port) as url:
        yield url


@contextmanager
def published(name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`atropos env publish NAME --as ors` on 127.0.0.1 (our venv); yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "atropos", "env", "publish", name, "--as", "ors"]
    argv += ["--port", str(port), *flags]
    with running(argv, "/health", port, env) as url:
        yield url


def openreward_session(
    python: Path, url: str, env: str, calls: list[dict[str, Any]], split: str = "train",
    index: int = 0, key: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """openreward's client through one session (tests/interop/clients/ors_session.py)."""
    script = Path(__file__).resolve().parent / "clients" / "ors_session.py"
    extra = {"OPENREWARD_DISABLE_UPDATE_CHECK": "1", "OPENREWARD_API_KEY": key or ""}
    done = subprocess.run(
        [str(python), str(script), url, env, split, str(index), json.dumps(calls)],
        env={**os.environ, **extra}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found
