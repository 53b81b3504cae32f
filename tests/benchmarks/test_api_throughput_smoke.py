"""Smoke test of benchmarks/api_throughput.py: a tiny workload against our server only."""

from __future__ import annotations

from pathlib import Path

import pytest

from atropos.testing import load_script

pytest.importorskip("aiohttp")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "api_throughput.py"


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_tiny_workload_drains_every_group(store: str) -> None:
    bench = load_script(SCRIPT)
    w = bench.Workload(
        groups=40, group_size=8, seq_len=32, batch_size=16, connections=4, envs=2, timeout=60
    )
    bodies = bench.encode_bodies(w)
    assert len(bodies) == 40 and all(b.gzipped for b in bodies)

    result = bench.measure_server("ours", w, bodies, store=store)

    for phase in (result.streaming, result.queued):
        assert phase.groups_posted == 40
        assert phase.groups_drained == 40
        assert phase.batches == w.batches == 20
        assert len(phase.batch_latencies_ms) == 20
        assert phase.wall_s > 0 and phase.post_s > 0
        assert phase.server_cpu_s >= 0  # /proc counts 10 ms ticks: a tiny phase may read 0
        assert phase.peak_rss_mib >= phase.final_rss_mib > 0
        summary = phase.summary(w.groups)
        assert summary["batch_p99_ms"] >= summary["batch_p50_ms"] > 0
    assert result.queued.rss_queued_mib > 0

    table = bench.summarize({"ours": result}, w)
    assert "| streaming | server CPU s / 1000 groups |" in bench.markdown_table(table, ["ours"])
