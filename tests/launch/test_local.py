"""`atropos launch` on this machine: the shipped local example, end to end, with real processes.

Each test runs `python -m atropos launch examples/launch/local.yaml` as a child process and
reads what it leaves in the run directory (`launch.json`, logs, the trainer's metrics).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "launch" / "local.yaml"
STEPS = 6


class Launch:
    def __init__(self, run_dir: Path, *overrides: str) -> None:
        self.run_dir = run_dir
        sets = [f"run.directory={run_dir}", *overrides]
        argv = [sys.executable, "-m", "atropos", "launch", str(EXAMPLE), "--no-live"]
        for item in sets:
            argv += ["--set", item]
        self.log = (run_dir.parent / f"{run_dir.name}-launch.log").open("w+")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def record(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "launch.json").read_text())
        except (OSError, ValueError):
            return {}

    def process(self, name: str) -> dict[str, Any]:
        for entry in self.record().get("processes", []):
            if entry["name"] == name:
                return entry
        return {}

    def trainer_steps(self) -> int:
        path = self.run_dir / "trainer" / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_for(self, what: str, test: Any, deadline: float = 120) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if test():
                return
            assert self.proc.poll() is None, (
                f"launch exited while waiting for {what}\n{self.output()}"
            )
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n{self.output()}")

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launch did not end in {timeout} s\n{self.output()}") from None

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-6000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        record = launch.record()
        launch.close()
        for entry in record.get("processes", []):  # nothing of a failed test is left running
            if entry.get("pid"):
                try:
                    os.killpg(entry["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def accounted(env: dict[str, Any]) -> bool:
    """Every group the API accepted from `env` went into a batch, waits for one, or was dropped
    by the API for a stated reason (stale, oversize): none lost."""
    dropped = sum(env["drops"].values())
    return bool(env["groups_in"] == env["groups_out"] + env["waiting_groups"] + dropped)


def test_example_run_completes_and_the_counts_agree(tmp_path: Path, launches: list) -> None:
    launch = Launch(tmp_path / "run", f"trainer.args.steps={STEPS}")
    launches.append(launch)
    assert launch.wait() == 0, launch.output()
    record = launch.record()
    assert record["exit_code"] == 0
    assert {p["name"]: p["state"] for p in record["processes"]} == {
        "api": "stopped", "policy": "stopped", "trainer": "exited", "arithmetic": "exited",
    }  # fmt: skip
    assert launch.trainer_steps() == STEPS
    stats = record["api_stats"]
    assert stats["step"] == STEPS  # the API served one batch per trainer step
    (env,) = stats["envs"].values()
    assert env["env_key"] == "arithmetic-local/arithmetic"
    assert env["duplicates"] == 0
    sent = json.loads(
        (tmp_path / "run" / "envs" / "arithmetic" / "metrics.jsonl").read_text().splitlines()[-1]
    )
    assert accounted(env)
    assert env["groups_out"] * 8 >= STEPS * 64
    assert sent  # the env wrote its metrics under the run directory
    for name in ("api", "policy", "trainer", "arithmetic"):
        assert (tmp_path / "run" / "logs" / f"{name}.log").stat().st_size > 0


def test_sigint_mid_run_leaves_no_process(tmp_path: Path, launches: list) -> None:
    launch = Launch(tmp_path / "run", "trainer.args.steps=500")
    launches.append(launch)
    launch.wait_for("the first trainer step", lambda: launch.trainer_steps() >= 1)
    pids = [p["pid"] for p in launch.record()["processes"] if p.get("pid")]
    assert len(pids) == 4
    launch.proc.send_signal(signal.SIGINT)
    assert launch.wait(90) == 130, launch.output()
    assert [pid for pid in pids if alive(pid)] == []
    record = launch.record()
    trainer = next(p for p in record["processes"] if p["name"] == "trainer")
    assert trainer["exit_codes"] == [0]  # it checkpointed and stopped on SIGTERM


def test_killed_env_replica_is_restarted_and_nothing_is_lost(
    tmp_path: Path, launches: list
) -> None:
    launch = Launch(
        tmp_path / "run", "envs.0.replicas=2", "trainer.args.steps=14", "envs.0.restart.backoff=0.2"
    )
    launches.append(launch)
    launch.wait_for("the second trainer step", lambda: launch.trainer_steps() >= 2)
    victim = launch.process("arithmetic-0")
    os.killpg(victim["pid"], signal.SIGKILL)
    launch.wait_for(
        "arithmetic-0 to come back",
        lambda: (
            launch.process("arithmetic-0").get("restarts") == 1
            and launch.process("arithmetic-0").get("state") == "ready"
        ),
    )
    assert launch.wait() == 0, launch.output()
    record = launch.record()
    env = next(p for p in record["processes"] if p["name"] == "arithmetic-0")
    assert env["restarts"] == 1 and env["exit_codes"][0] == 128 + signal.SIGKILL
    envs = record["api_stats"]["envs"].values()
    assert sorted(e["env_key"] for e in envs) == [
        "arithmetic-local/arithmetic-0", "arithmetic-local/arithmetic-1",
    ]  # fmt: skip  # the restarted replica kept its registration: no third env
    for e in envs:
        assert e["duplicates"] == 0
        assert accounted(e)
    assert record["api_stats"]["step"] == 14


def test_a_process_that_never_gets_ready_fails_the_launch_in_time(
    tmp_path: Path, launches: list
) -> None:
    forever = "import time; print('loading forever', flush=True); time.sleep(600)"
    stuck = {
        "name": "stuck", "type": "vllm", "model": "m", "ready_timeout": 3,
        "command": f'{sys.executable} -c "{forever}"',
    }  # fmt: skip
    launch = Launch(tmp_path / "run", f"inference={json.dumps([stuck])}", "trainer.args.sync=none")
    launches.append(launch)
    t0 = time.monotonic()
    assert launch.wait(60) == 1
    assert time.monotonic() - t0 < 30
    out = launch.output()
    assert "stuck did not come up: stuck was not ready within 3 s" in out
    assert "loading forever" in out  # the tail of its log
    assert launch.process("api")["state"] == "stopped"
