"""A new user's walk with `atropos launch`, as real processes: a tiny run to its end, the same
command again (one line: the run is complete; nothing starts), the run extended with
`--set trainer.args.steps=N` as that line says, and a mistyped trainer argument, refused in
seconds before anything starts, dry run or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "launch" / "local.yaml"
STEPS = 2
pytestmark = pytest.mark.slow


def launch(
    run_dir: Path, *argv: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`atropos launch examples/launch/local.yaml --no-live` in run_dir's parent; the result and
    how long it took."""
    command = [sys.executable, "-m", "atropos", "launch", str(EXAMPLE), "--no-live"]
    command += ["--set", f"run.directory={run_dir}", *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done, time.monotonic() - started


def snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of the run directory: (size, mtime in ns)."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in run_dir.rglob("*")
        if p.is_file()
    }


def test_a_finished_run_is_said_complete_and_can_be_extended(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first, _ = launch(run_dir, "--set", f"trainer.args.steps={STEPS}", timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    before = snapshot(run_dir)

    again, took = launch(run_dir, "--set", f"trainer.args.steps={STEPS}", timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "" and "{}" not in again.stderr
    (line,) = again.stderr.splitlines()
    assert f"is complete: its trainer is at step {STEPS} of {STEPS}" in line
    assert "nothing was started" in line and "--set trainer.args.steps=N" in line
    assert snapshot(run_dir) == before  # no process started: no log, store or record touched
    assert took < 30

    extended, _ = launch(run_dir, "--set", f"trainer.args.steps={STEPS + 1}", timeout=300)
    assert extended.returncode == 0, extended.stdout + extended.stderr
    metrics = (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == STEPS + 1  # one more step, from the checkpoint


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_bad_trainer_argument_fails_fast_before_anything_starts(
    dry_run: bool, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    sets = ["--set", "trainer.args.batch-size=abc", *(["--dry-run"] if dry_run else [])]
    done, took = launch(run_dir, *sets, timeout=60)
    assert done.returncode == 2
    assert took < 15
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"atropos launch: error: {EXAMPLE}: trainer.args.batch-size: ")
    assert "(got 'abc')" in line and line.endswith("[trainer: atropos train]")
    assert "Traceback" not in done.stdout + done.stderr
    assert not run_dir.exists()
