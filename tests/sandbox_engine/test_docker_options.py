"""The docker provider's `profile` ("locked" and "task"), `mounts`, how a signalled command is
reported, and a start deadline that passes while the engine still creates the container
(nothing is orphaned), against the tests' own engine."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox_engine.test_docker_provider import containers, docker_host

from atropos.sandbox import SandboxError, SandboxSpec, open_sandbox
from atropos.sandbox.docker import DockerSandbox

__all__ = ["docker_host"]  # a fixture, shared with the provider's tests
LOOK = (
    "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ls /sys/class/net; "
    "touch /usr/x 2>/dev/null; echo root $?; test -f debian_version; echo image $?"
)


@pytest.fixture
def tool() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="atropos-mount-test-", dir="/tmp"))
    (top / "tool").mkdir()
    (top / "tool" / "tool.txt").write_text("from the host\n")
    yield top / "tool"
    shutil.rmtree(top, ignore_errors=True)


def test_the_task_profile_against_the_locked_one(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> list[Any]:
        found = []
        for profile in ("locked", "task"):
            spec = SandboxSpec(image=sandbox_image, workdir="/etc", profile=profile, pids=32)
            async with await open_sandbox(spec, "docker") as box:
                await box.put("made-here.txt", b"put")
                inspected = docker_host.docker(
                    ["inspect", "--format", "{{.HostConfig.PidsLimit}}", box.name]  # type: ignore[attr-defined]
                )
                found += [await box.exec(LOOK, timeout=30), await box.get("made-here.txt")]
                found.append(inspected.stdout.strip())
        return found

    locked, locked_put, locked_pids, task, task_put, task_pids = asyncio.run(main())
    assert b"CapEff:\t0000000000000000" in locked.stdout, locked
    assert b"NoNewPrivs:\t1" in locked.stdout and b"NoNewPrivs:\t1" in task.stdout
    assert b"root 1\nimage 1\n" in locked.stdout, locked  # read-only; /etc an empty volume
    assert b"CapEff:\t0000000000000000" not in task.stdout, task  # Docker's defaults
    assert b"root 0\nimage 0\n" in task.stdout, task  # writable; the image's own /etc
    for result in (locked, task):
        assert b"\nlo\nroot" in result.stdout, result  # only lo: the network is unchanged
    assert locked_put == task_put == b"put" and locked_pids == task_pids == "34"
    assert containers(docker_host) == []


@pytest.mark.parametrize("profile", ["locked", "task"])
def test_mounts_are_read_only_binds(
    docker_host: Any, sandbox_image: str, tool: Path, profile: str
) -> None:
    mounts = {"/opt/agent": tool, "/etc/agent.txt": tool / "tool.txt"}
    spec = SandboxSpec(image=sandbox_image, mounts=mounts, profile=profile)  # type: ignore[arg-type]
    script = (
        "cat /opt/agent/tool.txt /etc/agent.txt; echo x >> /opt/agent/tool.txt; echo write $?; "
        "touch /opt/agent/new; echo new $?; echo x >> /etc/agent.txt; echo file $?"
    )

    async def main() -> Any:
        async with await open_sandbox(spec, "docker") as box:
            return await box.exec(script, timeout=30)

    result = asyncio.run(main())
    lines = result.stdout.decode().splitlines()
    assert lines[:2] == ["from the host"] * 2, result
    assert all(not line.endswith(" 0") for line in lines[2:]) and len(lines) == 5, result
    assert b"Read-only file system" in result.stderr, result
    assert (tool / "tool.txt").read_text() == "from the host\n" and not (tool / "new").exists()


def test_a_signalled_command_reads_minus_the_signal(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> list[int]:
        async with await open_sandbox(SandboxSpec(image=sandbox_image), "docker") as box:
            kill = ["python3", "-c", "import os; os.kill(os.getpid(), 15)"]
            return [(await box.exec(argv, timeout=30)).exit_code for argv in (kill, ["false"])]

    assert asyncio.run(main()) == [-15, 1]


def test_a_start_deadline_during_the_create_orphans_nothing(
    docker_host: Any, sandbox_image: str
) -> None:
    """The create request reaches the engine, which makes the container only after the start's
    deadline has passed (a loaded engine): the container is still removed by the start."""
    delay, deadline = 1.5, 0.3

    async def main() -> tuple[SandboxError, float]:
        box = DockerSandbox(SandboxSpec(image=sandbox_image))
        real = box.engine.request
        sent: list[asyncio.Task[Any]] = []

        async def slow_engine(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if path != "/containers/create":
                return await real(method, path, *args, **kwargs)

            async def engine_side() -> Any:  # the engine got the request; it answers late
                await asyncio.sleep(delay)
                return await real(method, path, *args, **kwargs)

            sent.append(asyncio.ensure_future(engine_side()))
            return await asyncio.shield(sent[0])

        box.engine.request = slow_engine  # type: ignore[method-assign]
        began = time.monotonic()
        with pytest.raises(SandboxError) as failed:
            await box.start(deadline)
        took = time.monotonic() - began
        await asyncio.gather(*sent, return_exceptions=True)  # the engine's side is done
        return failed.value, took

    error, took = asyncio.run(main())
    assert error.reason == "start_timeout", error
    assert took >= delay  # the start waited for the create it had sent, then removed it
    assert containers(docker_host) == []
    volumes = docker_host.docker(["volume", "ls", "-q", "--filter", "label=atropos.sandbox=1"])
    assert volumes.stdout.split() == []
