"""A real Docker engine for tests: Debian's dockerd and containerd run as child processes from
one directory, reached on a unix socket there, and stopped by pid; no systemd, no TCP port, and
never the system's dockerd, containerd or their sockets.

`make test` installs the packages (`apt-get install docker.io mmdebstrap`; tested with Debian
12's Docker 20.10.24 and containerd 1.6). Use it as a context manager::

    with DockerEngine(tmp_path) as engine:
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"],
                       env=engine.environ, check=True)

`engine.environ` is this process's environment with `DOCKER_HOST=unix://<dir>/docker.sock`
(and no inherited `DOCKER_*`), for every docker client call.

What `start()` runs, all state in the directory:

- `containerd --config <dir>/containerd.toml`: its root, state and gRPC socket in the
  directory, the CRI plugin off. Our own, so dockerd never picks up a system containerd
  (dockerd uses /run/containerd/containerd.sock when it exists and `--containerd` is unset).
- `dockerd --containerd <that socket> -H unix://<dir>/docker.sock --data-root --exec-root
  --pidfile` in the directory, `--iptables=false --ip6tables=false --bridge=none`: no
  firewall rules and no docker0 bridge, so containers have `--network none` (or the host's
  network if asked; the tests never do). `HTTP(S)_PROXY` points at 127.0.0.1:9, where
  nothing listens: a pull fails at once instead of reaching out or hanging.
- Ready once `GET /_ping` on the socket answers `OK` (about 0.2 s on a 2-core machine).

Every daemon (and containerd's shims, which inherit its environment) carries `ATROPOS_TEST_
DOCKER=<this engine's id>` in its environment. `start()` first sweeps engines a killed test
session left behind: processes with that variable whose parent is gone (adopted by init).

`stop()` removes every container (`docker rm -f`), sends SIGTERM to dockerd then containerd
(each in its own process group; SIGKILL after a grace period), then kills by pid anything
left whose command line names the directory (containerd's shims), unmounts what is still
mounted under it and deletes the data. `left_behind()` lists what would leak.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atropos.testing.proc import Process, kill_strays, live_processes, stop_group

__all__ = ["DockerEngine", "DockerUnavailable", "docker_unavailable_reason"]

PROGRAMS = ("dockerd", "containerd", "docker", "containerd-shim-runc-v2", "runc")
SBIN = ("/usr/sbin", "/sbin")
INSTALL_HINT = (
    "run `make test`, which installs Debian's docker.io and mmdebstrap "
    "(or as root: apt-get install -y docker.io mmdebstrap)"
)
MARKER = "ATROPOS_TEST_DOCKER"  # in the environment of every daemon an engine starts
NO_PROXY_HERE = "http://127.0.0.1:9"  # the discard port: nothing listens, a pull fails at once
MAX_SOCKET_PATH = 107  # a unix socket path holds at most 107 bytes
#: The engine's longest socket, under its directory: dockerd's network controller listens on
#: `<exec-root>/libnetwork/<12 hex digits>.sock` (a longer path fails dockerd's start).
LONGEST_SOCKET = "exec/libnetwork/0123456789ab.sock"
CONTAINERD_TOML = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
"""


class DockerUnavailable(RuntimeError):
    """dockerd or containerd is not installed, or this process is not root."""


def find_program(name: str) -> str | None:
    """`name` on PATH or in /usr/sbin and /sbin; None when it is not installed."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def docker_unavailable_reason() -> str | None:
    """Why a DockerEngine cannot start here, or None when it can."""
    missing = [name for name in PROGRAMS if find_program(name) is None]
    if missing:
        return f"Docker is not installed ({', '.join(missing)} not found): {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "DockerEngine needs root (dockerd runs rootful here): run the tests as root"
    return None


def _marker_of(pid: int) -> str | None:
    """The engine id in a process's environment (`MARKER`), None when unmarked or gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(f"{MARKER}=".encode()):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def sweep_orphans(grace: float = 5.0) -> list[Process]:
    """SIGKILL, by pid, what is left of engines whose test session died without stopping
    them; the processes killed. An engine lives while one of its marked processes has a
    parent other than init (its daemons are the session's children); shims are always
    adopted by init, so they alone do not keep an engine alive."""
    marked = [(p, _marker_of(p.pid)) for p in live_processes()]
    alive = {marker for p, marker in marked if marker is not None and p.ppid != 1}
    orphans = [p for p, marker in marked if marker is not None and marker not in alive]
    if not orphans:
        return []
    killed, _ = kill_strays(orphans, [], grace)
    for process in killed:  # dockerd's own mounts of its data and exec roots
        roots = re.findall(r"--(?:data|exec)-root (\S+)", process.cmdline)
        for mount in reversed(mounts_under([Path(root) for root in roots])):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    return killed


def mounts_under(directories: Sequence[Path]) -> list[str]:
    """Mount points at or under `directories`, in /proc/self/mounts's order."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].replace("\\040", " ")
            if any(point == str(d) or point.startswith(f"{d}/") for d in directories):
                found.append(point)
    return found


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def ping(path: str | os.PathLike[str], timeout: float = 2.0) -> bool:
    """Whether the Docker API on unix socket `path` answers `GET /_ping` with OK."""
    connection = _UnixConnection(str(path), timeout)
    try:
        connection.request("GET", "/_ping")
        response = connection.getresponse()
        return response.status == 200 and response.read() == b"OK"
    except OSError:
        return False
    finally:
        connection.close()


class DockerEngine:
    """dockerd and containerd run from `directory`, stopped by pid on exit."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        start_deadline: float = 60.0,
        stop_grace: float = 10.0,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.socket = self.directory / "docker.sock"
        self.containerd_socket = self.directory / "containerd.sock"
        self.host = f"unix://{self.socket}"
        self.start_deadline, self.stop_grace = start_deadline, stop_grace
        self.environ = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        self.environ["DOCKER_HOST"] = self.host
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.started_in: float | None = None  # seconds from launch to ready
        self.strays: list[Process] = []
        self.swept: list[Process] = []  # orphans of killed sessions, found by `start()`
        self.marker = uuid.uuid4().hex

    def __enter__(self) -> DockerEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"DockerEngine({self.host})"

    def docker(
        self, args: Sequence[str], timeout: float = 60.0, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a docker client command against this engine; output is captured as text."""
        return subprocess.run(
            [find_program("docker") or "docker", *args],
            env=self.environ, capture_output=True, text=True, timeout=timeout, **kwargs,
        )  # fmt: skip

    def start(self) -> None:
        reason = docker_unavailable_reason()
        if reason is not None:
            raise DockerUnavailable(reason)
        longest = len(str(self.directory / LONGEST_SOCKET))
        if longest > MAX_SOCKET_PATH:
            raise ValueError(
                f"{self.directory} is too long a path for the engine's sockets (dockerd's"
                f" {LONGEST_SOCKET} under it would be {longest} bytes, past {MAX_SOCKET_PATH}):"
                " give it a shorter directory"
            )
        self.swept = sweep_orphans(self.stop_grace)
        self.directory.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        try:
            self._launch("containerd", self._containerd_command())
            self._wait(lambda: self.containerd_socket.exists(), "containerd's socket")
            self._launch("dockerd", self._dockerd_command())
            self._wait(lambda: ping(self.socket), "dockerd's /_ping")
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def _containerd_command(self) -> list[str]:
        config = self.directory / "containerd.toml"
        config.write_text(
            CONTAINERD_TOML.format(
                root=self.directory / "containerd-root",
                state=self.directory / "containerd-state",
                socket=self.containerd_socket,
            )
        )
        return [find_program("containerd") or "containerd", "--config", str(config)]

    def _dockerd_command(self) -> list[str]:
        return [
            find_program("dockerd") or "dockerd",
            "--host", self.host,
            "--containerd", str(self.containerd_socket),
            "--containerd-namespace", "atropos-test",
            "--containerd-plugins-namespace", "atropos-test-plugins",
            "--data-root", str(self.directory / "data"),
            "--exec-root", str(self.directory / "exec"),
            "--pidfile", str(self.directory / "dockerd.pid"),
            "--iptables=false", "--ip6tables=false", "--bridge=none",
            "--userland-proxy=false",
        ]  # fmt: skip

    def _launch(self, name: str, command: list[str]) -> None:
        env = dict(self.environ)
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[key] = NO_PROXY_HERE
        env[MARKER] = self.marker
        env.pop("NO_PROXY", None)
        env.pop("no_proxy", None)
        with open(self.directory / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip

    def _wait(self, ready: Any, what: str) -> None:
        end = time.monotonic() + self.start_deadline
        while time.monotonic() < end:
            if ready():
                return
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise DockerUnavailable(
                        f"{name} exited ({process.returncode}):\n{self.log(name)}"
                    )
            time.sleep(0.05)
        raise DockerUnavailable(
            f"no {what} within {self.start_deadline:.0f} s:\n{self.log('dockerd')}"
        )

    def log(self, name: str, lines: int = 20) -> str:
        """The last lines of a daemon's log (`dockerd` or `containerd`)."""
        with contextlib.suppress(OSError):
            text = (self.directory / f"{name}.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """Remove every container, stop the daemons by pid, kill what is left of them."""
        before = self._ours()
        if "dockerd" in self.processes and ping(self.socket):
            listed = self.docker(["ps", "-aq"], timeout=30)
            ids = listed.stdout.split()
            if ids:
                self.docker(["rm", "-f", *ids], timeout=60)
        for name in ("dockerd", "containerd"):
            process = self.processes.pop(name, None)
            if process is not None:
                stop_group(process, self.stop_grace)
        killed, _ = kill_strays(before, self._ours(), self.stop_grace)
        self.strays = killed
        for mount in reversed(self.mounts()):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        for name in ("data", "exec", "containerd-root", "containerd-state"):
            shutil.rmtree(self.directory / name, ignore_errors=True)

    def _ours(self) -> list[Process]:
        """Live processes that carry this engine's marker or name its directory (never this
        process, which may name the directory too: a script given it as an argument)."""
        mark, me = str(self.directory), os.getpid()
        return [
            p
            for p in live_processes()
            if p.pid != me and (mark in p.cmdline or _marker_of(p.pid) == self.marker)
        ]

    def mounts(self) -> list[str]:
        """Mount points under the engine's directory, as /proc/self/mounts lists them."""
        return mounts_under([self.directory])

    def left_behind(self) -> list[str]:
        """What of this engine is still there: live processes naming its directory, mounts
        under it, and its sockets."""
        left = [f"pid {p.pid}: {p.cmdline}" for p in self._ours()]
        left += [f"mount {m}" for m in self.mounts()]
        left += [f"socket {s}" for s in (self.socket, self.containerd_socket) if s.exists()]
        return left
