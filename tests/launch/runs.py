"""Running `atropos launch` as a child process in tests, and reading what it leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "launch"


class Launch:
    def __init__(
        self,
        run_dir: Path,
        *overrides: str,
        example: str = "local.yaml",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        sets = [f"run.directory={run_dir}", *overrides]
        argv = [sys.executable, "-m", "atropos", "launch", str(EXAMPLES / example), "--no-live"]
        for item in sets:
            argv += ["--set", item]
        self.log = (run_dir.parent / f"{run_dir.name}-launch.log").open("w+")
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(environ or {})},
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


def alive(pid: int) -> bool:
    """Whether the process group `pid` still has a member."""
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


def kill_leftovers(launch: Launch) -> None:
    """SIGKILL the launch and every process group it recorded (after a failed test)."""
    record = launch.record()
    launch.close()
    for entry in record.get("processes", []):
        if entry.get("pid"):
            try:
                os.killpg(entry["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def require(missing: str | None) -> None:
    """Skip a test whose real part (Ray, Slurm) is `missing` (its install hint), but fail under
    CI, where `make test` has installed it and a skip would hide a broken install."""
    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(missing)
    pytest.skip(missing)
