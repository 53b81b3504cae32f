"""The two-node loopback Ray cluster (atropos.testing.ray_cluster): an actor asking for the worker
node's custom resource runs there, everything listens on 127.0.0.1 on ports the harness chose,
and no process of the cluster outlives it. One cluster for the module; drivers are subprocesses
(`cluster.run_driver`), so this process never imports ray. Without ray the tests skip, and fail
under CI (`CI` set), where `make test` has installed the ray extra."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from atropos.testing.proc import live_processes
from atropos.testing.ray_cluster import (
    MISSING_RAY,
    RayCluster,
    RayNotInstalledError,
    ray_available,
)

from .runs import require

pytestmark = pytest.mark.slow  # a two-node cluster: about 7 s to start on 2 cores, 4 s to stop

PLACEMENT = """
import json, ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote
class Where:
    def node(self):
        return ray.get_runtime_context().get_node_id()

pinned = [Where.options(resources={"env_node": 1}).remote() for _ in range(2)]
anywhere = Where.remote()
print(json.dumps({
    "driver": ray.get_runtime_context().get_node_id(),
    "pinned": ray.get([a.node.remote() for a in pinned]),
    "anywhere": ray.get(anywhere.node.remote()),
}))
"""

# An actor on the worker node starts three `sleep 60`s: a plain child, a child in a session of
# its own, and a daemon (a grandchild in its own session, whose parent exits at once); the actor
# is then killed with ray.kill, and the driver reports which sleeps are still alive.
SUBPROCESSES = """
import json, subprocess, sys, time, ray
ray.init(logging_level="ERROR", log_to_driver=False)
DAEMON = ("import subprocess; print(subprocess.Popen(['sleep', '60'], start_new_session=True,"
          " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")

@ray.remote(resources={"env_node": 1})
class Spawner:
    def spawn(self):
        plain = subprocess.Popen(["sleep", "60"]).pid
        own_session = subprocess.Popen(["sleep", "60"], start_new_session=True).pid
        daemon = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True)
        return {"plain": plain, "own_session": own_session, "daemon": int(daemon.stdout)}

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False

spawner = Spawner.remote()
pids = ray.get(spawner.spawn.remote())
ray.kill(spawner)
deadline = time.monotonic() + 20
while (alive(pids["plain"]) or alive(pids["own_session"])) and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"pids": pids, "alive": {name: alive(pid) for name, pid in pids.items()}}))
"""


def _alive(pid: int) -> bool:
    return any(p.pid == pid for p in live_processes())


@pytest.fixture(scope="module")
def escaped() -> list[int]:
    """Pids of processes that tests saw outlive their actor; none may outlive the cluster."""
    return []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, escaped: list[int]) -> Iterator[RayCluster]:
    require(None if ray_available() else MISSING_RAY)
    started = time.monotonic()
    running = RayCluster(tmp_path_factory.mktemp("ray"), worker_resources={"env_node": 4})
    with running:
        print(f"[ray] two nodes up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield running
        stopping = time.monotonic()
    strays = [(p.pid, p.cmdline[:60]) for p in running.strays]
    print(
        f"[ray] stopped in {time.monotonic() - stopping:.1f} s; strays: {strays}", file=sys.stderr
    )
    assert not running.processes()
    assert {p.pid for p in running.strays} >= set(escaped)
    assert not [pid for pid in escaped if _alive(pid)]


def _run(cluster: RayCluster, code: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cluster.run_driver(code).strip().splitlines()[-1])
    return out


def test_without_ray_the_cluster_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """First in the file, so that the module fixture's teardown checks report on the last."""
    import atropos.testing.ray_cluster as ray_cluster

    monkeypatch.setattr(ray_cluster, "ray_available", lambda: False)
    with pytest.raises(RayNotInstalledError, match="make test"):
        RayCluster("unused")


def test_an_actor_asking_for_the_worker_resource_runs_on_the_worker_node(
    cluster: RayCluster,
) -> None:
    assert cluster.head_node_id and cluster.worker_node_id
    assert cluster.head_node_id != cluster.worker_node_id
    seen = _run(cluster, PLACEMENT)
    assert seen["pinned"] == [cluster.worker_node_id] * 2
    assert seen["anywhere"] in {cluster.head_node_id, cluster.worker_node_id}
    # a driver attaches to a node on its host: Ray 2.60 prefers the head, 2.40 took either
    assert seen["driver"] in {cluster.head_node_id, cluster.worker_node_id}


def test_everything_listens_on_loopback_on_ports_the_harness_chose(cluster: RayCluster) -> None:
    head, worker = cluster.ports["head"], cluster.ports["worker"]
    assert not head.all() & worker.all()
    listening = cluster.listeners()
    ports = {s.port for s in listening}
    assert ports >= {cluster.gcs_port, head.node_manager, head.object_manager}
    assert ports >= {worker.node_manager, worker.object_manager}
    assert ports >= {head.runtime_env_agent, worker.runtime_env_agent}
    assert [s for s in listening if s.host != "127.0.0.1"] == []
    assert ports <= {cluster.gcs_port} | head.all() | worker.all()


def test_ray_kill_takes_an_actors_children_but_not_a_daemon_which_stop_then_kills(
    cluster: RayCluster, escaped: list[int]
) -> None:
    seen = _run(cluster, SUBPROCESSES)
    daemon = seen["pids"]["daemon"]
    escaped.append(daemon)
    assert seen["alive"] == {"plain": False, "own_session": False, "daemon": True}
    assert daemon in {p.pid for p in cluster.processes()}  # found by the marker it inherited
    # the fixture checks that cluster.stop() kills it and lists it in cluster.strays
