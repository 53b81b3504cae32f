"""`atropos launch` with backend slurm: the job's layout and script (no cluster needed), and the
shipped example submitted to a real one-node Slurm (`atropos.testing.slurm`): it completes with
the trainer's metrics in the run directory, `--cancel` stops a running job in order, Ctrl-C
detaches from a job that goes on, and a process that never gets ready fails the job in time.

The cluster tests skip without Slurm (or root), except under CI (`CI` set), where they fail:
there `make test` must have installed the packages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.inference.slurm import expand_hostlist, slurm_server_urls
from atropos.launch import config, sbatch, slurm_job
from atropos.launch.plan import Plan, build
from atropos.testing.slurm import SlurmCluster, slurm_unavailable_reason

from .runs import require

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "launch" / "slurm.yaml"
STEPS = 5
# servers listen on loopback in tests (the one node is this machine)
LOOPBACK = ("api.host=127.0.0.1", "inference.0.host=127.0.0.1")

RUN: dict[str, Any] = {
    "run": {"name": "t", "backend": "slurm", "slurm": {"nodes": 3}},
    "inference": [{"name": "policy", "type": "local", "model": "tiny", "replicas": 2}],
    "envs": [{"name": "arithmetic", "replicas": 3}],
    "trainer": {"model": "tiny"},
}


def placed(data: dict[str, Any], *overrides: str) -> Plan:
    run = config.parse(data, overrides)
    return sbatch.place(build(run, Path("/tmp/run")), run)


def nodes_of(plan: Plan) -> dict[str, int | None]:
    return {p.name: p.node for p in plan.processes}


def problems(data: dict[str, Any], *overrides: str) -> list[str]:
    with pytest.raises(sbatch.SlurmPlanError) as err:
        placed(data, *overrides)
    return err.value.lines


# ----- layout and script, without a cluster ------------------------------------------------------


def test_api_and_trainer_on_the_first_node_the_rest_spread_over_the_others() -> None:
    assert nodes_of(placed(RUN)) == {
        "api": 0, "policy-0": 1, "policy-1": 2, "trainer": 0,
        "arithmetic-0": 1, "arithmetic-1": 2, "arithmetic-2": 1,
    }  # fmt: skip
    one = placed(RUN, "run.slurm.nodes=1")
    assert set(nodes_of(one).values()) == {0}
    moved = placed(RUN, "trainer.node=2", "envs.0.node=0")
    assert moved.get("trainer").node == 2
    assert {moved.get(f"arithmetic-{i}").node for i in range(3)} == {0}


def test_a_node_outside_the_job_is_named_with_its_key() -> None:
    assert problems(RUN, "envs.0.node=3", "api.node=5") == [
        "api.node: 5 is not a node of the job (run.slurm.nodes is 3: nodes 0 to 2); raise"
        " run.slurm.nodes or give a lower node",
        "envs[0].node: 3 is not a node of the job (run.slurm.nodes is 3: nodes 0 to 2); raise"
        " run.slurm.nodes or give a lower node",
    ]


def test_gpus_are_split_per_node_and_must_fit() -> None:
    gpu = placed(
        RUN, "run.slurm.gpus_per_node=4", "inference.0.replicas=4", "inference.0.gpus=2",
        "trainer.gpus=2",
    )  # fmt: skip
    assert [(p.name, p.node, p.gpu_ids) for p in gpu.processes if p.gpus] == [
        ("policy-0", 1, [0, 1]), ("policy-1", 2, [0, 1]), ("policy-2", 1, [2, 3]),
        ("policy-3", 2, [2, 3]), ("trainer", 0, [0, 1]),
    ]  # fmt: skip
    # a server that asks for GPUs goes to the next node with enough left
    fits = placed(
        RUN, "run.slurm.gpus_per_node=2", "inference.0.gpus=2", "inference.0.replicas=1",
        "trainer.gpus=2", "trainer.node=1",
    )  # fmt: skip
    assert nodes_of(fits)["policy"] == 2
    (line,) = problems(RUN, "run.slurm.gpus_per_node=2", "trainer.gpus=3")
    assert line.startswith("node 0 of the job gets 3 GPU(s) (trainer 3) and run.slurm.gpus_per")
    (line,) = problems(RUN, "inference.0.gpus=1", "inference.0.replicas=1")
    assert "node 1 of the job gets 1 GPU(s) (policy 1) and run.slurm.gpus_per_node is 0" in line


def test_ports_hosts_and_addresses() -> None:
    plan = placed(RUN, "api.port=8000", "inference.0.port=9000")
    assert [(p.name, p.host, p.port) for p in plan.processes if p.port] == [
        ("api", "0.0.0.0", 8000), ("policy-0", "0.0.0.0", 9000), ("policy-1", "0.0.0.0", 9001),
    ]  # fmt: skip
    free = placed(RUN)
    ports = [p.port for p in free.processes if p.port]
    assert len(ports) == 3 and len(set(ports)) == 3 and all(ports)
    (line,) = problems(RUN, "api.port=9000", "inference.0.port=9000", "inference.0.node=0")
    assert line.startswith("api and policy-0 both listen on port 9000 of node 0")
    (line,) = problems(RUN, "api.host=127.0.0.1")
    assert line.startswith("api binds 127.0.0.1, a loopback address, but the run spans nodes")
    assert placed(RUN, "api.host=127.0.0.1", "run.slurm.nodes=1").get("api").host == "127.0.0.1"


def script_of(*overrides: str) -> str:
    run = config.parse(RUN, overrides)
    plan = sbatch.place(build(run, Path("/tmp/run")), run)
    return sbatch.script(plan, run, python="/opt/py/bin/python", cwd=Path("/work"))


def test_script_lines_and_bash_syntax(tmp_path: Path) -> None:
    text = script_of(
        "run.slurm.gpus_per_node=2", "inference.0.gpus=1", "run.slurm.partition=gpu",
        "run.slurm.account=lab", "run.slurm.sbatch=[--qos=high]", "api.port=8000",
        "run.slurm.setup=[module load cuda]",
    )  # fmt: skip
    for line in (
        "#SBATCH --job-name=atropos-t", "#SBATCH --nodes=3", "#SBATCH --gpus-per-node=2",
        "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --qos=high",
        "#SBATCH --output=/tmp/run/logs/job-%j.out", "#SBATCH --chdir=/work",
        "#SBATCH --time=01:00:00", "#SBATCH --signal=B:TERM@210", "module load cuda",
        'export ATROPOS_ADDR_api="${NODES[0]}:8000"   # api binds 0.0.0.0:8000',
        'start policy-0 "${NODES[1]}"', 'start api "${NODES[0]}" --gres=none',
        "await_ready api policy-0 policy-1 || finish 1",
        "  stop_steps arithmetic-0 arithmetic-1 arithmetic-2",
        "ENVS_END=10   # seconds environments may take to end after the trainer finished",
        "      let_envs_end arithmetic-0 arithmetic-1 arithmetic-2",
    ):  # fmt: skip
        assert line in text.splitlines(), line
    # every #SBATCH line comes before the first command
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) < first_command
    (tmp_path / "job.sbatch").write_text(text)
    checked = subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True)
    assert checked.returncode == 0, checked.stderr
    # a short time limit leaves no room for the ordered stop before it: no --signal
    assert "#SBATCH --signal" not in script_of("run.slurm.time='00:05:00'")


def test_after_the_trainer_the_envs_get_envs_end_seconds_to_end_on_their_own() -> None:
    """The script's `let_envs_end` returns once the named steps have ended, and at its
    deadline (saying so) while one still runs; a step that ended before is not waited for."""
    functions = sbatch._FUNCTIONS
    shell = (
        functions
        + """
ENVS_END=3
sleep 0.5 & STEP[quick]=$!
sleep 30 & STEP[slow]=$!
true & STEP[gone]=$!
wait "${STEP[gone]}"
t0=$SECONDS; let_envs_end quick gone; echo "quick in $((SECONDS - t0))"
t0=$SECONDS; let_envs_end slow; echo "slow in $((SECONDS - t0))"
kill "${STEP[slow]}"
"""
    )
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] in ("quick in 0", "quick in 1"), done.stdout
    assert lines[1] == "[launch] environments still running 3 s after the trainer finished"
    assert lines[2] in ("slow in 2", "slow in 3"), done.stdout


def test_a_servers_own_python_runs_its_step_only() -> None:
    vllm = {"name": "vllm", "type": "vllm", "model": "m", "python": "/opt/vllm/bin/python"}
    text = script_of(f"inference={json.dumps([vllm])}")
    (shown,) = [line for line in text.splitlines() if "vllm.entrypoints" in line]
    assert shown.startswith("#   $ /opt/vllm/bin/python -m vllm.entrypoints.openai.api_server ")
    assert "#   env VLLM_SERVER_DEV_MODE=1" in text.splitlines()
    assert "#   $ /opt/py/bin/python -m atropos train " in text  # the others: run.slurm.python


def test_addresses_and_gpus_inside_the_job() -> None:
    plan = placed(RUN)
    environ = {
        sbatch.address_variable(p.name): f"node{p.node}:{p.port}" for p in plan.processes if p.port
    }
    book = slurm_job.address_book(plan, environ)
    assert book["policy-1"] == ("node2", plan.get("policy-1").port)
    with pytest.raises(slurm_job.JobError, match="ATROPOS_ADDR_api is ''"):
        slurm_job.address_book(plan, {})
    assert slurm_job.gpu_environ([1], {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == {
        "CUDA_VISIBLE_DEVICES": "GPU-b"
    }
    with pytest.raises(slurm_job.JobError, match="sees 1"):
        slurm_job.gpu_environ([0, 1], {"CUDA_VISIBLE_DEVICES": "3"})


def launch(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atropos", "launch", *args],
        capture_output=True, text=True, timeout=60, env=environ,
    )  # fmt: skip


def test_dry_run_prints_the_script_in_tier_order_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = launch(str(EXAMPLE), "--dry-run", "--set", f"run.directory={run_dir}")
    assert done.returncode == 0, done.stderr
    steps = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("start ")]
    assert steps == ["api", "policy", "trainer", "arithmetic"]
    assert done.stdout.startswith("#!/bin/bash\n")
    assert "ATROPOS_API_KEY" not in done.stdout and "<run key>" not in done.stdout
    assert not run_dir.exists()  # no key, no plan: nothing is written


def test_without_sbatch_nothing_is_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    environ = {**os.environ, "PATH": str(tmp_path / "empty")}
    done = launch(str(EXAMPLE), "--set", f"run.directory={run_dir}", environ=environ)
    assert done.returncode == 1
    assert done.stderr.startswith("atropos launch: error: sbatch not found: backend slurm needs")
    assert not run_dir.exists()


def test_cancel_without_a_job_says_so(tmp_path: Path) -> None:
    done = launch("--cancel", str(tmp_path))
    assert done.returncode == 1
    assert "job.json is missing" in done.stderr and "not the run directory" in done.stderr


# ----- a real one-node Slurm ---------------------------------------------------------------------


def require_slurm() -> None:
    require(slurm_unavailable_reason())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running
    assert running.leftover_pids() == []


class Launch:
    """`atropos launch examples/launch/slurm.yaml` run as a child, against the test cluster."""

    def __init__(self, cluster: SlurmCluster, run_dir: Path, *overrides: str) -> None:
        self.cluster, self.run_dir = cluster, run_dir
        argv = [sys.executable, "-m", "atropos", "launch", str(EXAMPLE)]
        for item in (f"run.directory={run_dir}", *LOOPBACK, *overrides):
            argv += ["--set", item]
        self.log = (run_dir.parent / f"{run_dir.name}-launch.log").open("w+")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=cluster.environ,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-6000:] + "\n" + self.job_output()

    def job_output(self) -> str:
        outputs = sorted((self.run_dir / "logs").glob("job-*.out"))
        return "".join(f"--- {p} ---\n{p.read_text()[-4000:]}" for p in outputs)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launch did not end in {timeout} s\n{self.output()}") from None

    def job_id(self) -> str:
        return str(json.loads((self.run_dir / "job.json").read_text())["job_id"])

    def record(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir / "launch.json").read_text()))
        except (OSError, ValueError):
            return {}

    def job_state(self) -> str:
        shown = self.cluster.run(["scontrol", "show", "job", "--oneliner", self.job_id()])
        fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
        return fields.get("JobState", "gone")

    def trainer_steps(self) -> int:
        path = self.run_dir / "trainer" / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_for(self, what: str, test: Callable[[], bool], deadline: float = 120) -> None:
        end = time.monotonic() + deadline
        while not test():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}\n{self.output()}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def launches(cluster: SlurmCluster) -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for each in started:
        each.close()
    cluster.cancel_all_jobs()  # a failed test leaves no job for the next


def job_pids(cluster: SlurmCluster, job_id: str) -> list[int]:
    """Processes of the job still alive (steps, servers, trainer): the cluster's leftover check,
    narrowed to the job's own."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for pid in cluster.leftover_pids():
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return found


def by_name(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in record["processes"]}


def test_the_example_job_completes_with_the_trainers_metrics(
    cluster: SlurmCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    secret = "slurm-s3cret-5"  # secret by its name: read by the steps from secrets.json
    run = Launch(
        cluster, tmp_path / "run", f"trainer.args.steps={STEPS}",
        f"envs.0.environ={{ATROPOS_TEST_TOKEN: {secret}}}",
    )  # fmt: skip
    launches.append(run)
    assert run.wait(240) == 0, run.output()
    assert run.trainer_steps() == STEPS
    assert run.job_state() == "COMPLETED"
    record = run.record()
    assert record["exit_code"] == 0 and record["job_id"] == run.job_id()
    procs = by_name(record)
    assert {name: p["state"] for name, p in procs.items()} == {
        "api": "stopped", "policy": "stopped", "trainer": "exited", "arithmetic": "exited",
    }  # fmt: skip
    assert procs["trainer"]["exit_codes"] == [0]
    assert {p["placement"]["node"] for p in procs.values()} == {cluster.hostname}
    assert record["api_stats"]["step"] == STEPS
    for name in procs:
        assert (run.run_dir / "status" / f"{name}.json").exists()
        assert (run.run_dir / "logs" / f"{name}.log").stat().st_size > 0
    assert (run.run_dir / "api.key").stat().st_mode & 0o777 == 0o600
    modes = {"secrets.json": 0o600, "plan.json": 0o600, "launch.json": 0o600, "job.sbatch": 0o700}
    for name, mode in modes.items():
        assert (run.run_dir / name).stat().st_mode & 0o777 == mode, name
    assert secret in (run.run_dir / "secrets.json").read_text()
    for path in [
        *(run.run_dir / n for n in modes if n != "secrets.json"),
        *run.run_dir.glob("logs/*"),
    ]:
        assert secret not in path.read_text(), path
    assert "#   env ATROPOS_TEST_TOKEN=***" in (run.run_dir / "job.sbatch").read_text()
    out = run.output()
    assert f"job {run.job_id()}: RUNNING" in out and "trainer step" in out
    # upstream's Slurm discovery reads the same node list the script expanded with scontrol
    assert expand_hostlist(record["nodelist"]) == record["nodes"] == [cluster.hostname]
    assert slurm_server_urls({"SLURM_JOB_NODELIST": record["nodelist"]}) is None  # one node
    assert job_pids(cluster, run.job_id()) == []


def test_cancel_stops_a_starting_job(
    cluster: SlurmCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    run = Launch(cluster, tmp_path / "run", "trainer.args.steps=500")
    launches.append(run)
    run.wait_for("the job to run", lambda: (run.run_dir / "job.json").exists())
    run.wait_for("the job to run", lambda: run.job_state() == "RUNNING")
    cancelled = launch("--cancel", str(run.run_dir), environ=cluster.environ)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"asked job {run.job_id()} to stop" in cancelled.stdout
    assert "the run stopped with exit status 143" in cancelled.stdout
    assert run.wait(60) == 143, run.output()  # the follower saw the run end
    assert run.job_state() != "RUNNING"
    assert job_pids(cluster, run.job_id()) == []


def test_ctrl_c_detaches_and_cancel_stops_the_run_in_order(
    cluster: SlurmCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    run = Launch(cluster, tmp_path / "run", "trainer.args.steps=500")
    launches.append(run)
    run.wait_for("the first trainer step", lambda: run.trainer_steps() >= 1, deadline=180)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(30) == 0, run.output()
    out = run.output()
    assert "detached" in out and f"atropos launch --cancel {run.run_dir}" in out
    assert run.job_state() == "RUNNING"
    steps = run.trainer_steps()
    run.wait_for("the run to go on", lambda: run.trainer_steps() > steps, deadline=60)

    cancelled = launch("--cancel", str(run.run_dir), environ=cluster.environ)
    assert cancelled.returncode == 0, cancelled.stderr
    record = run.record()
    assert record["exit_code"] == 143
    procs = by_name(record)
    assert {p["state"] for p in procs.values()} == {"stopped"}
    assert procs["trainer"]["exit_codes"] == [0]  # it checkpointed and stopped on SIGTERM
    job_out = run.job_output()
    order = [job_out.index(f"[launch] stopping {n}") for n in ("trainer", "arithmetic", "policy")]
    assert order == sorted(order) and job_out.index("[launch] stopping api") > order[-1]
    assert job_pids(cluster, run.job_id()) == []


def test_a_process_that_never_gets_ready_fails_the_job_in_time(
    cluster: SlurmCluster, tmp_path: Path, launches: list[Launch]
) -> None:
    forever = "import time; print('loading forever', flush=True); time.sleep(600)"
    stuck = {
        "name": "stuck", "type": "vllm", "model": "m", "ready_timeout": 3, "host": "127.0.0.1",
        "command": f'{sys.executable} -c "{forever}"',
    }  # fmt: skip
    run = Launch(
        cluster, tmp_path / "run", f"inference={json.dumps([stuck])}", "trainer.args.sync=none"
    )
    launches.append(run)
    t0 = time.monotonic()
    assert run.wait(90) == 1, run.output()
    assert time.monotonic() - t0 < 60
    out = run.output()
    assert "stuck did not come up: stuck was not ready within 3 s" in out
    assert "loading forever" in out  # the tail of its log
    assert by_name(run.record())["api"]["state"] == "stopped"
    assert job_pids(cluster, run.job_id()) == []
