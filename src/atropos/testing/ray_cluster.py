"""A real two-node Ray cluster on loopback, for tests: a head and one worker node on this host.

    with RayCluster(tmp_path, worker_resources={"env_node": 4}) as cluster:
        out = cluster.run_driver(script)  # a driver subprocess with cluster.environ
        cluster.head_node_id, cluster.worker_node_id, cluster.address  # "127.0.0.1:PORT"

A driver elsewhere (a launcher, a subprocess) needs `cluster.environ` in its environment; then
`ray.init()` connects and attaches to one of the nodes on its host (Ray 2.60 prefers the head;
2.40 took either). Needs the `ray` extra (core Ray only; `make test` installs it). Linux only:
it reads /proc.

The recipe, measured with Ray 2.60 (the version requirements/lock.txt pins); the same checks as
the tests (placement, binds, cleanup) also passed with Ray 2.40, the oldest the extra allows:

* Each node is one `ray start --block` child in its own session and process group (head first,
  then the worker), with every port Ray would open set from a free loopback port, so the two
  nodes never clash: GCS (`--port`, head), node manager, object manager, a 32-port worker range
  (core worker gRPC servers, drivers' included), dashboard agent HTTP and gRPC (the gRPC one is
  also the metrics agent port), metrics export, runtime env agent, and `--dashboard-port` (head;
  no dashboard runs: `--include-dashboard=false`, the minimal dashboard process left for usage
  stats opens no port). `--ray-client-server-port` is not passed: core Ray refuses it without
  `ray[client]` (grpcio), and without it no Ray Client server starts. Usage stats are off
  (`--disable-usage-stats`, RAY_USAGE_STATS_ENABLED=0). Token authentication is on
  (RAY_AUTH_MODE=token and a random RAY_AUTH_TOKEN per cluster; Ray >= 2.52, older releases
  ignore both): other local users reach loopback too, and without the token Ray refuses them.
* Loopback only. Ray binds its gRPC servers (GCS, raylet, object manager, core workers) to
  127.0.0.1 only when a node's IP is exactly 127.0.0.1; for any other IP (127.0.0.2 included)
  they bind every interface. But `ray start` and `ray.init` rewrite 127.0.0.1, as node IP and
  in `--address`, to the host's outward IP (the source address towards 8.8.8.8), unless Ray
  thinks multi-node clusters are off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), in which case
  `ray start` refuses to start a worker node. So: every node process runs with
  RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (its local IP is 127.0.0.1), and `ray start` runs from a
  five-line wrapper (`_RAY_START`) that, in that one process, turns multi-node back on and keeps
  a loopback address as given. Drivers need RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 too (else
  `ray.init` dials the outward IP, where nothing listens): `cluster.environ` carries it.
* What binds where (seen with `ss -ltnp` while it ran, Ray 2.60 core; `cluster.listeners()`
  reads the same from /proc): gcs_server on 127.0.0.1:<port>; on each node, the raylet on
  127.0.0.1:<node manager> and 127.0.0.1:<object manager>, the runtime env agent on
  127.0.0.1:<runtime env agent>, and every worker process (actors, idle workers, and drivers
  attached to that node) on one port of the node's worker range, on 127.0.0.1. The dashboard
  agent runs but, minimal without `ray[default]`, opens neither of its ports; nothing listens
  on the metrics export port or the dashboard port either. No UDP. Nothing on 0.0.0.0.
* Temp dirs: each node gets its own `--temp-dir` (`<base_dir>/head`, `<base_dir>/worker`);
  Ray puts its session (logs, sockets, spilled objects) under it. Per-node temp dirs came in
  late 2025 (ray-project/ray#57735): before, a worker node ignores its `--temp-dir` (with a
  warning) and shares the head's session dir (several raylets in one session dir work: socket
  names get a suffix). Unix socket paths must stay under 108 bytes and the session name alone
  takes about 41, so a `base_dir` longer than 40 characters gets its Ray temp dirs in a short
  `tempfile.mkdtemp` dir instead (removed on stop). RAY_TMPDIR points there too, so nothing
  lands in /tmp/ray.
* Readiness: the head's log says "Ray runtime started", then the worker node's does, then a
  short-lived driver (`ray.nodes()`) sees both alive; every wait has a deadline and a failure
  quotes the tail of the `ray start` logs.
* Stop: SIGTERM to the worker node's process group, then the head's, SIGKILL to a group still
  there after `stop_grace` seconds. RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 makes a node shut
  down at once on SIGTERM (by default it drains for up to 30 s first). Ray puts each worker
  process in a process group of its own, so a group signal reaches actors only through their
  raylet, which stops its workers. Whatever is left is found three ways: every process the
  cluster starts carries a marker in its environment (`ATROPOS_RAY_CLUSTER`), inherited by
  whatever an actor starts; Ray's own processes name the temp dir in their command line; and
  the descendants of the `ray start` processes are listed before the first signal (Ray's
  workers and agents retitle themselves, which can blank what /proc shows of their
  environment). Each such process still alive afterwards is SIGKILLed by pid and listed in
  `cluster.strays`. Zombies do not count (pid 1 on some machines reaps late). Never
  `ray stop`: it stops every Ray on the machine.

What happens to an actor's subprocesses on `ray.kill(actor)` (measured, Ray 2.60): the raylet
SIGKILLs the actor's worker process group (each worker leads a group of its own; raylet.out:
"Stop: sending SIGKILL to pgid=..."), and Ray kills a worker's direct children when it exits
(RAY_kill_child_processes_on_worker_exit, on by default). So a plain `subprocess.Popen` child
dies within a second, and so does a direct child in a session of its own
(`start_new_session=True`). A daemon (a grandchild in its own session whose parent exited)
outlives `ray.kill`, the driver and both nodes; stop() finds it by the marker, kills it and
lists it in `cluster.strays`. RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=1
would make the raylet kill such descendants too; it is left off, as by default.

Caveats: a worker node's `ray start` that cannot reach the GCS ignores SIGTERM (it sits in a
C++ connect loop); stop() SIGKILLs it after the grace period. The `ray start` wrapper sets two
private Ray names and checks they exist, so a Ray release that renames them fails loudly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from atropos.install import install_hint
from atropos.net import free_port
from atropos.testing.proc import (
    Listener,
    Process,
    descendants,
    environ_has,
    kill_strays,
    listeners,
    live_processes,
    stop_group,
)

__all__ = ["NodePorts", "RayCluster", "RayNotInstalledError", "ray_available", "require_ray"]

MISSING_RAY = (
    "ray is not installed: run `make test`, which installs the ray extra "
    f"(or `{install_hint('ray')}`)"
)
MARKER = "ATROPOS_RAY_CLUSTER"
WORKER_PORTS = 32  # worker processes per node, drivers included; each takes one port
SOCKET_ROOM = 40  # longest base_dir whose session sockets stay under the AF_UNIX limit

# `ray start` with loopback kept as given (see the module docstring). Runs as `python -c`.
_RAY_START = """\
import sys
import ray._private.ray_constants as constants, ray._private.services as services
for module, name in ((constants, "ENABLE_RAY_CLUSTER"), (services, "resolve_ip_for_localhost")):
    if not hasattr(module, name):
        sys.exit(f"this Ray has no {module.__name__}.{name}: update atropos' ray_cluster.py")
constants.ENABLE_RAY_CLUSTER = True  # this process only: it must accept a second node
services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1 as given
from ray.scripts.scripts import main
sys.argv = ["ray", "start", *sys.argv[1:]]
sys.exit(main())
"""

# Polls ray.nodes() until the node manager ports in argv are alive; prints {port: node id}.
_PROBE = """\
import json, sys, time
import ray
ports = {int(p) for p in sys.argv[2:]}
deadline = time.monotonic() + float(sys.argv[1])
ray.init(logging_level="ERROR", log_to_driver=False)
try:
    while True:
        alive = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        if ports <= set(alive) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
finally:
    ray.shutdown()
print(json.dumps({str(p): alive.get(p) for p in ports}))
"""


class RayNotInstalledError(RuntimeError):
    """The `ray` package is missing; the message says how to install it."""


def ray_available() -> bool:
    """Whether `import ray` would work (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def require_ray() -> None:
    """Raise RayNotInstalledError, saying how to install ray, when it is missing."""
    if not ray_available():
        raise RayNotInstalledError(MISSING_RAY)


@dataclass(frozen=True)
class NodePorts:
    """Every TCP port one Ray node may open, all on 127.0.0.1."""

    node_manager: int
    object_manager: int
    min_worker: int
    max_worker: int
    dashboard_agent_http: int
    dashboard_agent_grpc: int  # Ray uses it as the metrics agent port too
    metrics_export: int
    runtime_env_agent: int

    def flags(self) -> list[str]:
        """The `ray start` options that set these ports."""
        return [
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
            f"--dashboard-agent-listen-port={self.dashboard_agent_http}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--metrics-export-port={self.metrics_export}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
        ]

    def all(self) -> set[int]:
        """Every port above, the worker range spelled out."""
        fixed = {self.node_manager, self.object_manager, self.dashboard_agent_http}
        fixed |= {self.dashboard_agent_grpc, self.metrics_export, self.runtime_env_agent}
        return fixed | set(range(self.min_worker, self.max_worker + 1))


class _Ports:
    """Free loopback ports, never the same one twice within one cluster."""

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def one(self) -> int:
        for _ in range(100):
            port = free_port()
            if port not in self.taken:
                self.taken.add(port)
                return port
        raise RuntimeError("no free TCP port on 127.0.0.1 after 100 tries")

    def span(self, count: int) -> tuple[int, int]:
        """First and last of `count` consecutive free ports, below the kernel's ephemeral
        range (so outgoing connections do not take them before Ray binds them)."""
        low = _ephemeral_low()
        for _ in range(200):
            first = random.randrange(10_000, low - count)
            ports = range(first, first + count)
            if not self.taken.intersection(ports) and all(map(_bindable, ports)):
                self.taken.update(ports)
                return first, first + count - 1
        raise RuntimeError(f"no {count} consecutive free TCP ports on 127.0.0.1 below {low}")

    def node(self) -> NodePorts:
        first, last = self.span(WORKER_PORTS)
        agent_http, agent_grpc, metrics, runtime_env = (self.one() for _ in range(4))
        return NodePorts(
            self.one(), self.one(), first, last, agent_http, agent_grpc, metrics, runtime_env
        )


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class _Node:
    name: str
    ports: NodePorts
    temp_dir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            return f"--- {self.name} node: no log ({e})"
        return f"--- {self.name} node, last lines of {self.log}:\n" + "\n".join(text)


class RayCluster:
    """A head and a worker Ray node on 127.0.0.1, started on enter, stopped on exit.

    Args:
        base_dir: where the `ray start` logs and (if its path is short) Ray's temp dirs go.
        worker_resources: custom resources of the worker node, e.g. {"env_node": 4}.
        head_cpus, worker_cpus: logical CPUs each node advertises.
        object_store_bytes: each node's object store (Ray's minimum is 75 MiB).
        start_timeout: seconds for the whole start, until both nodes are alive.
        stop_grace: seconds a process group gets between SIGTERM and SIGKILL.

    Raises:
        RayNotInstalledError: ray is not installed.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        worker_resources: Mapping[str, float] | None = None,
        head_cpus: int = 2,
        worker_cpus: int = 2,
        object_store_bytes: int = 80 * 1024 * 1024,
        start_timeout: float = 90.0,
        stop_grace: float = 10.0,
    ) -> None:
        require_ray()
        self.base_dir = Path(base_dir).resolve()
        self.worker_resources = dict(worker_resources or {})
        self.head_cpus, self.worker_cpus = head_cpus, worker_cpus
        self.object_store_bytes = object_store_bytes
        self.start_timeout, self.stop_grace = start_timeout, stop_grace
        self.marker = uuid.uuid4().hex  # in the environment of every process the nodes start
        self.token = secrets.token_hex(32)  # Ray's token authentication
        self.strays: list[Process] = []
        self.head_node_id = ""
        self.worker_node_id = ""
        ports = _Ports()
        self.gcs_port, self.dashboard_port = ports.one(), ports.one()
        self.ports = {"head": ports.node(), "worker": ports.node()}
        self._own_temp: Path | None = None
        self._nodes: list[_Node] = []

    @property
    def address(self) -> str:
        """The GCS address drivers and nodes connect to: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def ray_dir(self) -> Path:
        """The directory holding both nodes' Ray temp dirs (`head/`, `worker/`)."""
        return self._own_temp or self.base_dir

    @property
    def environ(self) -> dict[str, str]:
        """Environment variables a driver process needs (on top of os.environ)."""
        return {
            "RAY_ADDRESS": self.address,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keeps ray.init on 127.0.0.1
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_TMPDIR": str(self.ray_dir),
        }

    def run_driver(self, code: str, args: Sequence[str] = (), timeout: float = 60.0) -> str:
        """Run `code` (with `args` as sys.argv[1:]) in a Python driver subprocess with
        `environ`; return its stdout.

        Raises:
            RuntimeError: it failed or ran past `timeout` seconds (its stderr is quoted).
        """
        env = {**os.environ, **self.environ}
        command = [sys.executable, "-c", code, *args]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
            raise RuntimeError(f"Ray driver ran past {timeout} s; stderr:\n{stderr}") from None
        if done.returncode != 0:
            raise RuntimeError(
                f"Ray driver failed (exit {done.returncode}); stderr:\n{done.stderr[-4000:]}"
            )
        return done.stdout

    def processes(self) -> list[Process]:
        """Live processes of this cluster, at any depth: descendants of its `ray start`
        processes, and any process with its marker in the environment or its temp dirs in the
        command line (those find what outlived its parent)."""
        everything = live_processes()
        roots = {node.process.pid for node in self._nodes if node.process is not None}
        dirs = (str(self.ray_dir / "head"), str(self.ray_dir / "worker"))
        marked = {
            p.pid
            for p in everything
            if any(d in p.cmdline for d in dirs) or environ_has(p.pid, MARKER, self.marker)
        }
        return descendants(roots | marked, everything)

    def listeners(self) -> list[Listener]:
        """The TCP sockets this cluster's processes listen on."""
        return listeners({p.pid for p in self.processes()})

    # ---- start

    def __enter__(self) -> RayCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the head, then the worker node; return once both are alive in the GCS.

        Raises:
            TimeoutError: a node did not come up within `start_timeout` (log tails quoted).
            RuntimeError: a node's `ray start` exited, or the nodes could not be listed.
        """
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.base_dir)) > SOCKET_ROOM:
            self._own_temp = Path(tempfile.mkdtemp(prefix="ray-"))
        deadline = time.monotonic() + self.start_timeout
        try:
            head = self._launch("head", ["--head", f"--port={self.gcs_port}", *self._head_flags()])
            self._wait_started(head, deadline)
            worker = self._launch("worker", [f"--address={self.address}", *self._worker_flags()])
            self._wait_started(worker, deadline)
            self._wait_alive(deadline)
        except BaseException:
            self.stop()
            raise

    def _head_flags(self) -> list[str]:
        return [
            "--include-dashboard=false",
            f"--dashboard-port={self.dashboard_port}",
            f"--num-cpus={self.head_cpus}",
        ]

    def _worker_flags(self) -> list[str]:
        flags = [f"--num-cpus={self.worker_cpus}"]
        if self.worker_resources:
            flags.append(f"--resources={json.dumps(self.worker_resources)}")
        return flags

    def _launch(self, name: str, flags: list[str]) -> _Node:
        ports = self.ports[name]
        node = _Node(name, ports, self.ray_dir / name, self.base_dir / f"ray-{name}.log")
        self._nodes.append(node)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(
            {
                MARKER: self.marker,
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token,
                "RAY_TMPDIR": str(self.ray_dir),
            }
        )
        command = [
            *(sys.executable, "-c", _RAY_START, *flags),
            *("--node-ip-address=127.0.0.1", "--block", "--disable-usage-stats", "--num-gpus=0"),
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={node.temp_dir}",
            *ports.flags(),
        ]
        with node.log.open("wb") as log:
            node.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, which stop() signals
            )
        return node

    def _wait_started(self, node: _Node, deadline: float) -> None:
        assert node.process is not None
        while True:
            with contextlib.suppress(OSError):
                if b"Ray runtime started" in node.log.read_bytes():
                    return
            if node.process.poll() is not None:
                raise RuntimeError(
                    f"Ray {node.name} node's `ray start` exited (code "
                    f"{node.process.returncode}) before it started\n{self._tails()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Ray {node.name} node did not log 'Ray runtime started' within "
                    f"{self.start_timeout} s of the cluster's start\n{self._tails()}"
                )
            time.sleep(0.1)

    def _wait_alive(self, deadline: float) -> None:
        left = max(deadline - time.monotonic(), 1.0)
        head, worker = self.ports["head"].node_manager, self.ports["worker"].node_manager
        try:
            out = self.run_driver(_PROBE, [str(left), str(head), str(worker)], timeout=left + 30)
            ids = json.loads(out.strip().splitlines()[-1])
        except (RuntimeError, ValueError, IndexError) as e:
            raise RuntimeError(f"could not list the cluster's nodes: {e}\n{self._tails()}") from e
        self.head_node_id, self.worker_node_id = ids[str(head)] or "", ids[str(worker)] or ""
        if not (self.head_node_id and self.worker_node_id):
            raise TimeoutError(
                f"Ray nodes alive in the GCS within {self.start_timeout} s of the start: head "
                f"{self.head_node_id or 'no'}, worker {self.worker_node_id or 'no'}\n"
                + self._tails()
            )

    def _tails(self) -> str:
        return "\n".join(node.tail() for node in self._nodes)

    # ---- stop

    def stop(self) -> None:
        """Stop the worker node, then the head, then any process of theirs left; idempotent.

        Raises:
            RuntimeError: a process of the cluster survived SIGKILL.
        """
        before = self.processes()  # while the parents live: finds the retitled ones too
        for node in reversed(self._nodes):
            if node.process is not None:
                stop_group(node.process, self.stop_grace)
                node.process = None
        found, survivors = kill_strays(before, self.processes(), self.stop_grace)
        self.strays.extend(found)
        if self._own_temp is not None:
            shutil.rmtree(self._own_temp, ignore_errors=True)
        if survivors:
            listing = "; ".join(f"{p.pid} {p.cmdline[:200]}" for p in survivors)
            raise RuntimeError(f"processes of the Ray test cluster survived SIGKILL: {listing}")
