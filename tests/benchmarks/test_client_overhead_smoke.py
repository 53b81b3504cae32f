"""Smoke test of benchmarks/client_overhead.py: a tiny batch, two rounds, every way measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "client_overhead.py"


def test_a_tiny_batch_is_measured_every_way(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    args = ["--groups", "2", "--group-size", "4", "--seq-len", "64", "--rounds", "2"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "next_batch" in done.stdout and "packed" in done.stdout, done.stdout[-2000:]
    assert json.loads(out.read_text())
