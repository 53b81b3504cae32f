"""The docker provider against the tests' own engine (atropos.testing.docker): the Sandbox API
round trip, what a container isolates (docs/sandbox.md's docker column), its limits, an absent
image, the sweep of a killed owner's containers, and 64 sandboxes from a pool at once."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.sandbox import SandboxError, SandboxPool, SandboxSpec, open_sandbox
from atropos.sandbox.docker import DockerSandbox
from atropos.testing.proc import live_processes

# the processes of the sandbox other than the command that asks (and its shell)
OTHERS = (
    "import os\n"
    "me = {os.getpid(), os.getppid()}\n"
    "for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
    "    if pid not in me:\n"
    "        try: print(pid, open(f'/proc/{pid}/cmdline').read().replace('\\0', ' '))\n"
    "        except OSError: pass\n"
)


@pytest.fixture
def docker_host(
    docker_engine: Any, sandbox_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Any]:
    """`DOCKER_HOST` at the tests' engine (the provider reads it) and a private run root."""
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(tmp_path / "root"))
    yield docker_engine


def spec(image: str, **changes: Any) -> SandboxSpec:
    return SandboxSpec(image=image, **changes)


def containers(engine: Any, *names: str) -> list[str]:
    """The engine's containers (running or not) of the given names, else all labelled ours."""
    args = ["ps", "-aq", "--filter", "label=atropos.sandbox=1"]
    for name in names:
        args += ["--filter", f"name=^{name}$"]
    return engine.docker(args).stdout.split()


def test_round_trip_and_close_removes_the_container(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> tuple[Any, ...]:
        box = await open_sandbox(
            spec(sandbox_image, files={"main.py": b"print(6 * 7)"}, user="1000"), "docker"
        )
        assert isinstance(box, DockerSandbox)
        async with box:
            ran = await box.exec(["python3", "main.py"], timeout=20)
            piped = await box.exec("cat; echo $A; echo e >&2; exit 3", 20, b"in\n", {"A": "a"})
            await box.put("/work/sub/f.txt", b"data")
            writable = await box.exec("touch sub/g && id -u && id -g", timeout=20)
            got = await box.get("sub/f.txt")
            folder = await box.get("sub")
            everything = await box.get(".")
            listed = containers(docker_host, box.name)
        return box, ran, piped, writable, got, folder, everything, listed

    box, ran, piped, writable, got, folder, everything, listed = asyncio.run(main())
    assert (ran.exit_code, ran.stdout) == (0, b"42\n")
    assert (piped.exit_code, piped.stdout, piped.stderr) == (3, b"in\na\n", b"e\n")
    assert (writable.exit_code, writable.stdout) == (0, b"1000\n1000\n"), writable
    assert got == b"data"
    assert sorted(tarfile.open(fileobj=io.BytesIO(folder)).getnames()) == [
        "sub",
        "sub/f.txt",
        "sub/g",
    ]
    names = tarfile.open(fileobj=io.BytesIO(everything)).getnames()
    assert {"./main.py", "./sub/f.txt"} <= set(names)
    assert len(listed) == 1
    assert containers(docker_host, box.name) == []  # closed: the engine lists none
    volumes = docker_host.docker(["volume", "ls", "-q", "--filter", "label=atropos.sandbox=1"])
    assert volumes.stdout.split() == []
    with pytest.raises(SandboxError, match="closed"):
        asyncio.run(box.exec("true", timeout=5))


def test_paths_outside_the_work_dir_are_refused(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> None:
        async with await open_sandbox(spec(sandbox_image), "docker") as box:
            for bad in ("/etc/passwd", "../x", "/work/../etc"):
                with pytest.raises(ValueError):
                    await box.put(bad, b"x")
                with pytest.raises(ValueError):
                    await box.get(bad)
            with pytest.raises(FileNotFoundError):
                await box.get("absent.txt")

    asyncio.run(main())


def test_output_is_capped(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> Any:
        async with await open_sandbox(spec(sandbox_image, output_bytes=1000), "docker") as box:
            return await box.exec("head -c 5000000 /dev/zero; echo done >&2", timeout=30)

    result = asyncio.run(main())
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) == 1000 and result.stderr == b"done\n"


def test_timeout_kills_a_term_ignoring_tree(docker_host: Any, sandbox_image: str) -> None:
    tree = "trap '' TERM; (trap '' TERM; sleep 4321; true) & (sleep 4322; true) & sleep 4323"

    async def main() -> tuple[Any, float, Any]:
        async with await open_sandbox(spec(sandbox_image), "docker") as box:
            began = time.monotonic()
            result = await box.exec(tree, timeout=1)
            took = time.monotonic() - began
            return result, took, await box.exec(["python3", "-c", OTHERS], timeout=20)

    result, took, others = asyncio.run(main())
    assert result.timed_out and result.exit_code == -9
    assert took < 15  # the deadline, then a kill: not the sleeps' 4321 s
    assert b"432" not in others.stdout, others.stdout  # only init and its sleep are left
    assert len(others.stdout.splitlines()) == 2
    assert not [p for p in live_processes() if "sleep 432" in p.cmdline]


def test_network_is_none(docker_host: Any, sandbox_image: str) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = (
        "import os, socket\n"
        "print(sorted(os.listdir('/sys/class/net')))\n"
        f"s = socket.socket(); s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\n"
    )

    async def main() -> Any:
        async with await open_sandbox(spec(sandbox_image), "docker") as box:
            return await box.exec(["python3", "-c", probe], timeout=20)

    try:
        result = asyncio.run(main())
    finally:
        server.close()
    interfaces, errno = result.stdout.decode().split("\n")[:2]
    assert interfaces == "['lo']" and int(errno) != 0, result


def test_root_is_read_only_and_others_unreachable(docker_host: Any, sandbox_image: str) -> None:
    engine_socket = docker_host.host.removeprefix("unix://")
    look = (
        "touch /etc/x /usr/x /x 2>/dev/null; echo roots $?; touch /tmp/t && echo tmp ok; "
        f"ls {engine_socket} /var/run/docker.sock /run/containerd 2>/dev/null; echo sockets $?; "
        "find / -name 'secret-of-a*' -not -path '/proc/*' 2>/dev/null; echo found"
    )

    async def main() -> Any:
        async with await open_sandbox(spec(sandbox_image), "docker") as first:
            await first.put("secret-of-a.txt", b"a")
            async with await open_sandbox(spec(sandbox_image), "docker") as second:
                return await second.exec(look, timeout=30)

    result = asyncio.run(main())
    assert result.stdout.split(b"\n")[:2] == [b"roots 1", b"tmp ok"], result
    assert b"sockets 2\nfound\n" in result.stdout, result  # nothing listed, nothing found


def test_memory_limit_kills_the_hog(docker_host: Any, sandbox_image: str) -> None:
    hog = "x = bytearray(512 * 2**20); print('allocated')"

    async def main() -> tuple[Any, Any]:
        async with await open_sandbox(spec(sandbox_image, memory_bytes=64 << 20), "docker") as box:
            return await box.exec(["python3", "-c", hog], timeout=60), await box.exec(
                "echo alive", timeout=20
            )

    hog_result, after = asyncio.run(main())
    assert hog_result.exit_code == -9 and b"allocated" not in hog_result.stdout, hog_result
    assert after.stdout == b"alive\n"  # the cgroup's OOM killer took the hog, not the sandbox


def test_pids_limit_and_a_fork_bomb(docker_host: Any, sandbox_image: str) -> None:
    spawn = (
        "import os, time\nmade = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5); os._exit(0)\n"
        "    made += 1\nprint(made)\n"
    )
    bomb = "bash -c 'bomb_7319() { bomb_7319 | bomb_7319 & }; bomb_7319; sleep 30'"

    async def main() -> tuple[Any, Any, str]:
        box = await open_sandbox(spec(sandbox_image, pids=16), "docker")
        async with box:
            forks = await box.exec(["python3", "-c", spawn], timeout=60)
            await box.exec(bomb, timeout=3)
            return forks, await box.exec("echo still here", timeout=30), box.name

    forks, after, name = asyncio.run(main())
    assert forks.exit_code == 0 and 0 < int(forks.stdout.split()[-1]) < 16, forks
    assert containers(docker_host, name) == []
    assert not [p for p in live_processes() if "bomb_7319" in p.cmdline]
    assert after.exit_code in (0, 126, 1) or after.timed_out  # contained, whatever it ran into


def test_an_absent_image_is_one_clear_error_at_once(docker_host: Any) -> None:
    began = time.monotonic()
    with pytest.raises(SandboxError) as raised:
        asyncio.run(open_sandbox(SandboxSpec(image="python:3.11-slim"), "docker"))
    assert time.monotonic() - began < 10  # an error, never a pull that hangs
    assert raised.value.reason == "image_missing"
    message = str(raised.value)
    assert "'python:3.11-slim'" in message and "never pulled" in message
    assert "atropos sandbox image build python:3.11-slim --debian" in message
    assert containers(docker_host) == []


def test_limits_and_policies_map_to_the_container(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> tuple[Any, Any]:
        box = await open_sandbox(spec(sandbox_image, cpus=0.5, ttl_seconds=2), "docker")
        async with box:
            inspected = docker_host.docker(
                ["inspect", "--format", "{{.HostConfig.NanoCpus}} {{.Config.Labels}}", box.name]
            )
            await asyncio.sleep(2.2)
            with pytest.raises(SandboxError) as expired:
                await box.exec("true", timeout=5)
        return inspected, expired.value

    inspected, expired = asyncio.run(main())
    assert inspected.stdout.startswith("500000000 ") and "atropos.owner:owner-" in inspected.stdout
    assert expired.reason == "expired"


def test_a_container_removed_under_us_is_dead(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> SandboxError:
        async with await open_sandbox(spec(sandbox_image), "docker") as box:
            assert isinstance(box, DockerSandbox)
            docker_host.docker(["rm", "-fv", box.name])
            with pytest.raises(SandboxError) as raised:
                await box.exec("true", timeout=5)
            return raised.value

    assert asyncio.run(main()).reason == "dead"


OWNER = """
import asyncio
from atropos.sandbox import SandboxSpec, open_sandbox

async def main():
    boxes = [await open_sandbox(SandboxSpec(image={image!r}), "docker") for _ in range(2)]
    running = [asyncio.ensure_future(box.exec("sleep 1000", timeout=1000)) for box in boxes]
    await asyncio.sleep(0.5)
    print(" ".join(box.name for box in boxes), flush=True)
    await asyncio.gather(*running)

asyncio.run(main())
"""

NEXT = """
import asyncio
from atropos.sandbox import SandboxSpec, open_sandbox

async def main():
    async with await open_sandbox(SandboxSpec(image={image!r}), "docker"):
        pass

asyncio.run(main())
"""


def test_sigkill_of_the_owner_then_the_next_start_sweeps(
    docker_host: Any, sandbox_image: str
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(image=sandbox_image)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        names = owner.stdout.readline().split()
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    assert len(names) == 2 and all(containers(docker_host, name) for name in names)
    subprocess.run(
        [sys.executable, "-c", NEXT.format(image=sandbox_image)], check=True, timeout=120
    )  # a fresh process: its first docker sandbox sweeps
    assert containers(docker_host) == []
    volumes = docker_host.docker(["volume", "ls", "-q", "--filter", "label=atropos.sandbox=1"])
    assert volumes.stdout.split() == []


def test_64_at_once_from_a_pool(docker_host: Any, sandbox_image: str) -> None:
    async def main() -> tuple[list[bytes], int]:
        pool = SandboxPool(
            spec(sandbox_image), "docker", size=4, max_starting=8, max_live=64, start_timeout=240
        )
        async with pool:

            async def one(index: int) -> bytes:
                async with pool.sandbox() as box:
                    return (await box.exec(f"echo {index}", timeout=120)).stdout

            outputs = await asyncio.gather(*(one(i) for i in range(64)))
        return outputs, pool.failed_count

    outputs, failed = asyncio.run(main())
    assert outputs == [f"{i}\n".encode() for i in range(64)] and failed == 0
    assert containers(docker_host) == []
