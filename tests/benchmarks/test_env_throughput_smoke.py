"""Smoke test of benchmarks/env_throughput.py: our runtime only, 4 workers, a short window."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from atropos.testing import load_script

pytest.importorskip("aiohttp")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "env_throughput.py"


@pytest.mark.parametrize("mode", ["serve", "process"])
def test_rollouts_flow_and_the_numbers_are_positive(tmp_path, mode):
    bench = load_script(SCRIPT)
    w = bench.Workload(latency=0.05, warmup=0.5, duration=2.0, batch_size=16, start_timeout=90)
    lines: list[str] = []
    hooks = bench.Hooks(log=lines.append)

    r = asyncio.run(bench.measure_run("ours", mode, 4, w, sys.executable, tmp_path, hooks))

    s = r.summary()
    assert r.rollouts > 0 and r.groups > 0 and r.rollouts == r.groups * w.group_size
    assert r.window_s >= w.duration
    assert s["rollouts_per_s"] > 0 and s["ideal_per_s"] == 4 * 8 / 0.05
    assert 0 < s["pct_of_ideal"] <= 110  # a little over when a batch lands at the window's end
    assert r.env_cpu_s > 0 and s["env_cpu_us_per_rollout"] > 0
    assert r.fake_server_cpu_s > 0 and r.machine_busy_s > 0
    assert (r.api_cpu_s > 0) == (mode == "serve")
    assert r.series and r.series[-1][1] > 0
    assert r.env_log_errors == 0, (tmp_path / f"ours-{mode}-4" / "env.log").read_text()
    assert any("ours_single_turn.py" in line for line in lines)  # the command was logged

    table = bench.markdown([r], 90.0, 0.2)
    assert f"| ours | {mode} | 4 |" in table
