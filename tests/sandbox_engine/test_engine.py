"""The tests' Docker engine (atropos.testing.docker): it starts on its own socket, stops with
nothing left, isolates a `--network none` container from this machine's loopback, and
enforces memory, pids and read-only limits."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.net import free_port
from atropos.testing.docker import DockerEngine, mounts_under
from atropos.testing.proc import listeners, live_processes

SYSTEM_SOCKETS = ("/var/run/docker.sock", "/run/containerd/containerd.sock")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path for engines of the test's own: dockerd's sockets under it
    must fit a unix socket's 107 bytes, which a worker's deep `tmp_path` can pass."""
    folder = Path(tempfile.mkdtemp(prefix="atropos-docker-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_engine_starts_and_stops_with_nothing_left(short_dir: Path) -> None:
    system_before = {path: Path(path).exists() for path in SYSTEM_SOCKETS}
    with DockerEngine(short_dir / "e") as engine:
        assert engine.started_in is not None and engine.started_in < 30
        daemons = {name: process.pid for name, process in engine.processes.items()}
        assert set(daemons) == {"dockerd", "containerd"}
        assert listeners(set(daemons.values())) == []  # unix sockets only, no TCP port
        image = _host_usr_image(engine)
        run = ["run", "-d", "--network", "none", "-v", "/usr:/usr:ro", image, "sleep", "300"]
        started = engine.docker(run)
        assert started.returncode == 0, started.stderr
        assert engine.docker(["ps", "-q"]).stdout.split() == [started.stdout.strip()[:12]]
        assert engine.left_behind()  # the daemons and the container's shim
    assert engine.left_behind() == []
    alive = {p.pid for p in live_processes()}
    assert not alive & set(daemons.values())
    assert {path: Path(path).exists() for path in SYSTEM_SOCKETS} == system_before


def _host_usr_image(engine: DockerEngine) -> str:
    """A tiny image on a fresh engine, no registry and no build: a root of merged-/usr
    symlinks (Debian 12's layout) whose /usr is this machine's, bind-mounted read-only."""
    archive = engine.directory / "root.tar"
    with tarfile.open(archive, "w") as tar:
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
    done = engine.docker(["import", str(archive), "atropos-test-host-usr:1"])
    assert done.returncode == 0, done.stderr
    archive.unlink()
    return "atropos-test-host-usr:1"


def _run(engine: Any, *args: str, timeout: float = 60) -> Any:
    return engine.docker(["run", "--rm", "--network", "none", *args], timeout=timeout)


def test_network_none_cannot_reach_a_loopback_server(
    docker_engine: Any, sandbox_image: str
) -> None:
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    server.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    probe = (
        "import os, socket\n"
        "print(sorted(os.listdir('/sys/class/net')))\n"
        f"s = socket.socket(); s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\n"
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):  # it does listen
            pass
        time.sleep(0.3)
        seen_from_here = len(accepted)
        done = _run(docker_engine, sandbox_image, "python3", "-c", probe)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert done.returncode == 0, done.stderr
    interfaces, errno = done.stdout.split("\n")[:2]
    assert interfaces == "['lo']"
    assert int(errno) != 0  # refused inside the container's own network namespace
    assert len(accepted) == seen_from_here == 1


def test_memory_limit_kills_the_container(docker_engine: Any, sandbox_image: str) -> None:
    name = f"atropos-mem-{free_port()}"
    grab = "x = bytearray(256 * 2**20); print('allocated')"
    args = ["--memory", "64m", "--memory-swap", "64m", sandbox_image, "python3", "-c", grab]
    done = docker_engine.docker(["run", "--name", name, "--network", "none", *args], timeout=60)
    try:
        assert done.returncode == 137 and "allocated" not in done.stdout
        oom = docker_engine.docker(["inspect", "--format", "{{.State.OOMKilled}}", name])
        assert oom.stdout.strip() == "true"
    finally:
        docker_engine.docker(["rm", "-f", name])


def test_pids_limit_stops_a_fork_bomb(docker_engine: Any, sandbox_image: str) -> None:
    spawn = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(64):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5); os._exit(0)\n"
        "    made += 1\n"
        "print(made)\n"
    )
    done = _run(docker_engine, "--pids-limit", "16", sandbox_image, "python3", "-c", spawn)
    assert done.returncode == 0, done.stderr
    assert 0 < int(done.stdout.split()[-1]) < 16


def test_read_only_root(docker_engine: Any, sandbox_image: str) -> None:
    done = _run(docker_engine, "--read-only", "--tmpfs", "/tmp", sandbox_image, "bash", "-c",
                "touch /tmp/ok && touch /etc/no")  # fmt: skip
    assert done.returncode != 0 and "Read-only file system" in done.stderr


def test_docker_run_latency(docker_engine: Any, sandbox_image: str) -> None:
    times = []
    for _ in range(3):
        began = time.monotonic()
        done = _run(docker_engine, sandbox_image, "true")
        times.append(time.monotonic() - began)
        assert done.returncode == 0, done.stderr
    print(f"docker run --rm --network none: {', '.join(f'{t:.2f}' for t in times)} s")
    assert min(times) < 5


def test_an_engine_of_a_killed_session_is_swept_at_the_next_start(short_dir: Path) -> None:
    script = (
        "import sys, time\n"
        "from atropos.testing.docker import DockerEngine, mounts_under\n"
        "engine = DockerEngine(sys.argv[1]); engine.start()\n"
        "print(*(p.pid for p in engine.processes.values()), flush=True)\n"
        "time.sleep(300)\n"
    )
    session = subprocess.Popen(
        [sys.executable, "-c", script, str(short_dir / "killed")],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert session.stdout is not None
        daemons = {int(pid) for pid in session.stdout.readline().split()}
    finally:
        session.kill()  # SIGKILL: no stop(), the daemons are orphaned
        session.wait()
    assert len(daemons) == 2 and daemons <= {p.pid for p in live_processes()}
    with DockerEngine(short_dir / "next") as engine:
        assert daemons <= {p.pid for p in engine.swept}
    assert not daemons & {p.pid for p in live_processes()}
    assert mounts_under([short_dir]) == []


def test_a_directory_too_deep_for_dockerds_sockets_is_refused_naming_it(short_dir: Path) -> None:
    deep = short_dir / ("d" * (107 - len(str(short_dir)) - 34))  # one byte past, with the id
    engine = DockerEngine(deep)
    try:
        engine.start()
    except ValueError as refused:
        assert str(deep) in str(refused) and "exec/libnetwork" in str(refused)
    else:
        engine.stop()
        raise AssertionError("a directory too deep for dockerd's sockets was taken")
    assert not engine.processes and not deep.exists()  # refused before anything started
