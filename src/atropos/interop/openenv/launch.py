"""Starting an installed OpenEnv environment class as a server of its own, and stopping it.

`openenv:package.module:Class` names an `openenv.core.env_server.Environment` subclass. It is
served by openenv-core's own `create_app(Class, ActionCls, ObservationCls)` (the action and
observation classes read from its generic bases, `Environment[Act, Obs, State]`, else from
its `step` annotations) with uvicorn, on 127.0.0.1 at a free port, in a subprocess of its own:
by `--env.python` when set, else by this interpreter when it can import the module and
`openenv`, else by the interop venv's (`.cache/interop-venv/bin/python`, `make interop`).
The current directory is on the child's `PYTHONPATH`. Its session capacity
(`max_concurrent_envs`) is `--env.max_sessions` when the class says it supports concurrent
sessions, else 1 (and our episodes then take turns). It is stopped by its pid (SIGTERM, then
SIGKILL after the grace period) when the environment closes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from atropos.net import free_port

__all__ = ["INTEROP_PYTHON", "Launched", "choose_python", "launch"]

INTEROP_PYTHON = Path(__file__).resolve().parents[4] / ".cache" / "interop-venv" / "bin" / "python"
"""The checkout's interop venv (`make interop`), wherever the command runs from (as the
checkout's vLLM venv in `atropos.engines`)."""

_SERVE = r"""
import importlib, inspect, sys, typing
import uvicorn
from openenv.core.env_server import Action, Environment, Observation, create_fastapi_app
target, port, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
module, _, name = target.partition(":")
cls = getattr(importlib.import_module(module), name)
if not (isinstance(cls, type) and issubclass(cls, Environment)):
    sys.exit(f"openenv: {target} is not an openenv Environment subclass")
act = obs = None
for base in getattr(cls, "__orig_bases__", ()):
    for arg in typing.get_args(base):
        if isinstance(arg, type) and issubclass(arg, Action) and act is None: act = arg
        if isinstance(arg, type) and issubclass(arg, Observation) and obs is None: obs = arg
hints = typing.get_type_hints(cls.step)
def of(hint, base):
    return hint if isinstance(hint, type) and issubclass(hint, base) else None
act = act or of(hints.get("action"), Action) or Action
obs = obs or of(hints.get("return"), Observation) or Observation
if not getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False): sessions = 1
app = create_fastapi_app(cls, act, obs, max_concurrent_envs=sessions)
print(f"capacity {sessions}", flush=True)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def _importable(module: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in (module, "openenv"))
    except (ImportError, ValueError):
        return False


def choose_python(target: str, python: str = "") -> str:
    """The interpreter that serves `target` (module docstring); ValueError when none can."""
    if python:
        return python
    if _importable(target.partition(":")[0]):
        return sys.executable
    if INTEROP_PYTHON.exists():
        return str(INTEROP_PYTHON)
    raise ValueError(
        f"openenv: cannot import {target.partition(':')[0]!r} with openenv here, and there is no"
        f" {INTEROP_PYTHON} (make interop): install the package or name an interpreter with"
        " --env.python"
    )


@dataclass
class Launched:
    """A served environment class: its URL, session capacity and process."""

    url: str
    capacity: int
    process: subprocess.Popen[bytes]
    log: Path  # the server's output

    def output(self) -> str:
        """The last of the server's output."""
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    async def stop(self, grace: float = 5.0) -> None:
        """Stop the server by its pid: SIGTERM, SIGKILL after `grace` seconds."""
        proc = self.process
        if proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, grace)
        self.log.unlink(missing_ok=True)


async def launch(target: str, python: str, sessions: int, timeout: float) -> Launched:
    """Serve `target` (`package.module:Class`) and wait (at most `timeout` s) until its
    `/health` answers; ValueError with its output when it exits or does not answer."""
    import httpx

    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
    fd, log = tempfile.mkstemp(prefix="openenv-", suffix=".log")
    with os.fdopen(fd, "wb") as out:  # a file, not a pipe: a chatty server never blocks
        proc = subprocess.Popen(
            [choose_python(target, python), "-c", _SERVE, target, str(port), str(sessions)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    launched = Launched(f"http://127.0.0.1:{port}", 1, proc, Path(log))
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                text = launched.output()
                launched.log.unlink(missing_ok=True)
                raise ValueError(f"openenv: the server of {target} exited: {text}")
            try:
                if (await client.get(f"{launched.url}/health")).status_code == 200:
                    first = launched.output().partition("\n")[0]
                    if first.startswith("capacity "):
                        launched.capacity = int(first.split()[1])
                    return launched
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    text = launched.output()
    await launched.stop()
    raise ValueError(
        f"openenv: the server of {target} did not answer within {timeout:g} s"
        f" (--env.start_timeout); its output: {text or '(none)'}"
    )
