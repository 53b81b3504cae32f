"""network="model-only" on the docker provider: the container reaches the model's URL
(streamed responses arrive in pieces) and nothing else (another host port, an outside address,
DNS); the relay ends with the sandbox and with its owner's SIGKILL, and `sweep()` ends a dead
owner's relay that something else kept alive."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox.test_network_policy import DNS, REACH, STREAM, forbidden, model

from atropos.sandbox import _host, sweep
from atropos.sandbox.docker import DockerSandbox, sweep_docker
from atropos.sandbox.spec import SandboxSpec

__all__ = ["forbidden", "model"]  # fixtures, shared with the local providers' tests
pytestmark = pytest.mark.skipif(not _host.IS_ROOT, reason="model-only needs root")


@pytest.fixture
def engine_env(docker_engine: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    return docker_engine


def spec_for(image: str, port: int) -> SandboxSpec:
    return SandboxSpec(image=image, network="model-only", model_url=f"http://127.0.0.1:{port}/v1")


def test_model_only_reaches_the_model_and_nothing_else(
    engine_env: Any, sandbox_image: str, model: int, forbidden: socket.socket
) -> None:
    other = forbidden.getsockname()[1]
    hello = "import os, urllib.request; print(urllib.request.urlopen(os.environ['ATROPOS_MODEL_URL'] + '/hello', timeout=20).read().decode())"  # noqa: E501

    async def scenario() -> list[Any]:
        async with await DockerSandbox(spec_for(sandbox_image, model)).start(60) as box:
            assert box.model_url == f"http://127.0.0.1:{model}/v1"
            await box.put("reach.py", REACH.encode())
            return [
                await box.exec(["python3", "-c", hello], timeout=30),
                await box.exec(["python3", "reach.py", "127.0.0.1", str(other)], timeout=30),
                await box.exec(["python3", "reach.py", "1.1.1.1", "80"], timeout=30),
                await box.exec(["python3", "-c", DNS], timeout=30),
                await box.exec(["python3", "-c", STREAM], timeout=60),
            ]

    answer, other_port, outside, dns, stream = asyncio.run(scenario())
    assert answer.ok and answer.stdout == b"hello from the model\n", answer
    assert other_port.stdout.strip() == b"ECONNREFUSED", other_port
    with pytest.raises(BlockingIOError):
        forbidden.accept()
    assert outside.stdout.strip() == b"ENETUNREACH", outside  # no route: nothing sent
    assert dns.stdout.startswith(b"no dns"), dns
    assert stream.ok and stream.stdout.splitlines() == [
        b"first b'data: one\\n'",
        b"b'released'",
        b"rest b'\\ndata: two\\n\\n'",
    ], stream


def test_none_reaches_nothing(engine_env: Any, sandbox_image: str, model: int) -> None:
    async def scenario() -> Any:
        async with await DockerSandbox(SandboxSpec(image=sandbox_image)).start(60) as box:
            assert box.model_url is None
            await box.put("reach.py", REACH.encode())
            return await box.exec(["python3", "reach.py", "127.0.0.1", str(model)], timeout=30)

    result = asyncio.run(scenario())
    assert result.stdout.strip() in (b"ECONNREFUSED", b"ENETUNREACH"), result


def test_close_leaves_no_relay(engine_env: Any, sandbox_image: str, model: int) -> None:
    async def scenario() -> int:
        box = await DockerSandbox(spec_for(sandbox_image, model)).start(60)
        assert box.relay is not None
        pid = box.relay.proc.pid
        assert Path(f"/proc/{pid}").exists()
        await box.close()
        return pid

    assert not Path(f"/proc/{asyncio.run(scenario())}").exists()


OWNER = """
import asyncio, sys
from atropos.sandbox.docker import DockerSandbox
from atropos.sandbox.spec import SandboxSpec

async def main():
    spec = SandboxSpec(image=sys.argv[1], network="model-only", model_url=sys.argv[2])
    box = await DockerSandbox(spec).start(60)
    print(box.relay.proc.pid, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_sigkill_of_the_owner_ends_the_relay(
    engine_env: Any, sandbox_image: str, model: int
) -> None:
    url = f"http://127.0.0.1:{model}/v1"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, sandbox_image, url],
        stdout=subprocess.PIPE,
        env={**os.environ},
        text=True,
    )
    assert owner.stdout is not None
    relay = int(owner.stdout.readline())
    assert _alive(relay)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    while _alive(relay) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(relay)  # EOF on the pipe only its owner held
    assert asyncio.run(sweep_docker()) >= 1  # its container


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


HELD_OWNER = """
import asyncio, os, sys, time
from atropos.sandbox.docker import DockerSandbox
from atropos.sandbox.spec import SandboxSpec

async def main():
    spec = SandboxSpec(image=sys.argv[1], network="model-only", model_url=sys.argv[2])
    box = await DockerSandbox(spec).start(60)
    child = os.fork()  # it inherits the relay's stdin pipe: the relay outlives the owner
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print(box.relay.proc.pid, child, box.name, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_sweep_ends_a_dead_owners_relay_and_container(
    engine_env: Any, sandbox_image: str, model: int, tmp_path: Path, monkeypatch: Any
) -> None:
    """The relay's pipe is held by a child the owner forked, so only `sweep()` can end it."""
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(tmp_path / "root"))
    url = f"http://127.0.0.1:{model}/v1"
    owner = subprocess.Popen(
        [sys.executable, "-c", HELD_OWNER, sandbox_image, url],
        stdout=subprocess.PIPE, env={**os.environ}, text=True,
    )  # fmt: skip
    assert owner.stdout is not None
    relay, child, name = owner.stdout.readline().split()
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _alive(int(relay))  # its pipe is still open (the child)
        assert sweep() >= 1  # the container
        deadline = time.monotonic() + 10
        while _alive(int(relay)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(int(relay))
        listed = engine_env.docker(["ps", "-aq", "--filter", f"name=^{name}$"])
        assert listed.stdout.split() == []
    finally:
        os.kill(int(child), signal.SIGKILL)
