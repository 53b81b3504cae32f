"""How the docker sandbox names an exec that ends with its container, against a scripted engine.

A container's stop kills every process in it and the engine then drops the container's exec
instances, so an exec whose container dies is killed (exit 137), cannot start its process (126,
"task not found") or, between its create and its start or an inspect, is answered `404 No such
exec instance`. Each is the sandbox dying (`dead`), not the command's own end or a failed
start. A real container dying during an agent's command is tests/environments/
test_harbor_engine.py's; this pins each moment, which a real run cannot be made to hit on
purpose.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

import pytest

from atropos.sandbox._engine import EngineError, Response
from atropos.sandbox.docker import DockerSandbox
from atropos.sandbox.spec import ExecResult, SandboxError, SandboxSpec


class ScriptedEngine:
    """Answers an exec's create; fails its start with `start_error`, or else runs it to
    `exit_code` with no output; says whether the container runs with `running` (None: the
    container is gone too)."""

    socket = "/nonexistent/docker.sock"

    def __init__(
        self, start_error: EngineError | None, running: bool | None, exit_code: int = 0
    ) -> None:
        self.start_error, self.running, self.exit_code = start_error, running, exit_code

    async def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Response:
        if method == "POST" and path == "/containers/c1/exec":
            return Response(201, b'{"Id": "e1"}')
        if path == "/exec/e1/json":
            return Response(
                200, json.dumps({"Running": False, "ExitCode": self.exit_code}).encode()
            )
        if path == "/containers/c1/top":
            if self.running is None:
                raise EngineError(404, "No such container: c1")
            if not self.running:
                raise EngineError(409, "Container c1 is not running")
            return Response(200, json.dumps({"Titles": ["PID"], "Processes": [["1"]]}).encode())
        raise AssertionError(f"unexpected {method} {path}")

    async def hijack(self, path: str, body: Any) -> tuple[asyncio.StreamReader, Any]:
        if self.start_error is not None:
            raise self.start_error
        reader = asyncio.StreamReader()
        reader.feed_eof()  # the exec's stream: no output, then its end
        return reader, mock.Mock()


def run_exec(engine: ScriptedEngine) -> ExecResult:
    sandbox = DockerSandbox(SandboxSpec(image="scripted:latest"))
    sandbox.engine = engine  # type: ignore[assignment]
    sandbox.id, sandbox.started = "c1", 1.0
    return asyncio.run(sandbox.exec(["rm", "-f", "x"], timeout=5))


def failure(start_error: EngineError | None, running: bool | None, code: int = 0) -> SandboxError:
    with pytest.raises(SandboxError) as caught:
        run_exec(ScriptedEngine(start_error, running, code))
    return caught.value


LOST = EngineError(404, "No such exec instance: e1")


@pytest.mark.parametrize("running", [False, None])
def test_an_exec_lost_with_its_stopped_container_is_the_sandbox_dying(
    running: bool | None,
) -> None:
    died = failure(LOST, running)
    assert died.reason == "dead" and "stopped during exec ['rm']" in str(died)


def test_an_exec_lost_while_the_container_runs_stays_an_engine_failure() -> None:
    assert failure(LOST, running=True).reason == "start_failed"


def test_other_engine_errors_are_named_as_before() -> None:
    assert failure(EngineError(404, "No such container: c1"), running=None).reason == "dead"
    assert failure(EngineError(500, "oops"), running=True).reason == "start_failed"


def test_an_exec_killed_by_its_container_stopping_is_the_sandbox_dying() -> None:
    died = failure(None, running=False, code=137)
    assert died.reason == "dead" and "stopped while an exec ran" in str(died)


def test_an_exec_killed_in_a_running_container_is_the_commands_own_end() -> None:
    for code, status in ((137, -9), (126, 126), (127, 127)):
        assert run_exec(ScriptedEngine(None, running=True, exit_code=code)).exit_code == status
    assert run_exec(ScriptedEngine(None, running=False, exit_code=1)).exit_code == 1


@pytest.mark.parametrize("code", [126, 127])
def test_an_exec_the_engine_could_not_start_in_a_stopped_container_is_the_sandbox_dying(
    code: int,
) -> None:
    assert failure(None, running=False, code=code).reason == "dead"
