"""`atropos launch` with backend ray, on a real two-node Ray cluster on loopback.

The cluster (atropos.testing.ray_cluster) has a head node and a worker node offering the custom
resource `env_node`; the runs ask for it for the environment replicas, so they must land on the
worker node, and everything else anywhere. Launch runs as a child process with the cluster's
environment. Without ray the tests skip, and fail under CI (`CI` set), where `make test` has
installed the ray extra.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.testing.proc import live_processes
from atropos.testing.ray_cluster import MISSING_RAY, RayCluster, ray_available

from .runs import Launch, accounted, require

pytestmark = pytest.mark.slow

# Each process asks for half a CPU: the head and worker nodes have 2 each.
HALF_CPU = [f"{key}.cpus=0.5" for key in ("api", "inference.0", "trainer", "envs.0")]
ON_ENV_NODE = ["envs.0.replicas=2", "envs.0.resources={env_node: 1}"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    require(None if ray_available() else MISSING_RAY)
    with RayCluster(tmp_path_factory.mktemp("ray"), worker_resources={"env_node": 4}) as running:
        yield running
    assert not running.processes()


def named_actors(cluster: RayCluster) -> list[str]:
    code = (
        "import json, ray; ray.init(logging_level='ERROR', log_to_driver=False);"
        "print(json.dumps([a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]))"
    )
    names: list[str] = json.loads(cluster.run_driver(code).strip().splitlines()[-1])
    return names


def test_example_runs_with_env_replicas_on_the_env_node(
    cluster: RayCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    launch = Launch(
        tmp_path / "run", "trainer.args.steps=6", *HALF_CPU, *ON_ENV_NODE,
        example="ray.yaml", environ=cluster.environ,
    )  # fmt: skip
    launches.append(launch)
    assert launch.wait() == 0, launch.output()
    record = launch.record()
    assert record["ray"]["started_here"] is False
    placed = {p["name"]: p["placement"] for p in record["processes"]}
    for name in ("arithmetic-0", "arithmetic-1"):
        assert placed[name]["node_id"] == cluster.worker_node_id
    assert {p["node_id"] for p in placed.values()} <= {
        cluster.head_node_id, cluster.worker_node_id,
    }  # fmt: skip
    assert record["api_stats"]["step"] == 6
    assert all(accounted(e) for e in record["api_stats"]["envs"].values())
    assert len((tmp_path / "run" / "trainer" / "metrics.jsonl").read_text().splitlines()) == 6
    for name in placed:  # logs came back to the run directory
        assert (tmp_path / "run" / "logs" / f"{name}.log").stat().st_size > 0, name
    assert not [n for n in named_actors(cluster) if n.startswith("arithmetic-ray:")]


def test_a_killed_env_replica_comes_back(
    cluster: RayCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    launch = Launch(
        tmp_path / "run", "trainer.args.steps=14", "envs.0.restart.backoff=0.2", *HALF_CPU,
        *ON_ENV_NODE, example="ray.yaml", environ=cluster.environ,
    )  # fmt: skip
    launches.append(launch)
    steps = tmp_path / "run" / "trainer" / "metrics.jsonl"
    launch.wait_for(
        "the second trainer step",
        lambda: steps.exists() and len(steps.read_text().splitlines()) >= 2,
        deadline=180,
    )
    os.killpg(launch.process("arithmetic-1")["pid"], signal.SIGKILL)
    launch.wait_for(
        "arithmetic-1 to come back",
        lambda: (
            launch.process("arithmetic-1").get("restarts") == 1
            and launch.process("arithmetic-1").get("state") == "ready"
        ),
    )
    t0 = time.monotonic()
    assert launch.wait() == 0, launch.output()
    assert time.monotonic() - t0 < 180
    record = launch.record()
    envs = record["api_stats"]["envs"].values()
    assert len(envs) == 2 and all(accounted(e) and e["duplicates"] == 0 for e in envs)
    assert record["api_stats"]["step"] == 14


def test_without_an_address_launch_starts_and_stops_a_local_ray(
    tmp_path: Path, launches: list[Launch], monkeypatch: pytest.MonkeyPatch
) -> None:
    require(None if ray_available() else MISSING_RAY)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths are limited
    try:
        secret = "ray-s3cret-6"  # secret by its name: the actor gets it, no file holds it
        launch = Launch(
            tmp_path / "run", "trainer.args.steps=3",
            f"envs.0.environ={{ATROPOS_TEST_TOKEN: {secret}}}", example="ray.yaml",
            environ={"RAY_TMPDIR": str(ray_tmp)},
        )  # fmt: skip
        launches.append(launch)
        assert launch.wait() == 0, launch.output()
        assert launch.record()["ray"]["started_here"] is True
        for name in ("plan.json", "launch.json"):
            path = tmp_path / "run" / name
            assert path.stat().st_mode & 0o777 == 0o600 and secret not in path.read_text()
        assert secret not in launch.output() and not (tmp_path / "run" / "secrets.json").exists()
        assert any(ray_tmp.rglob("raylet.out"))  # the local Ray's session was there
        left = [p.pid for p in live_processes() if str(ray_tmp) in p.cmdline]
        assert left == []  # and nothing of it outlived the run
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
