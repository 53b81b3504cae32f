"""Latency in sight: the log-bucketed histogram (`atropos.inference.latency`), the stages a
serving env notes (rollout, server, queue wait, scoring) and sends with its status polls, and
the API's `/stats` and Prometheus `/metrics` showing them per env."""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx

from atropos.api import ApiConfig, create_app
from atropos.inference.latency import Latencies, Latency, note, note_call
from atropos.testing import FakeInferenceServer, serve_in_thread

from .arith import solver
from .test_policy_version import serve_until
from .test_runner import Trainer


def test_quantiles_are_within_half_a_bucket() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-2.0, 1.0) for _ in range(20_000)]
    lat = Latency()
    for v in values:
        lat.record(v)
    got = lat.summary(now=0.0)
    ordered = sorted(values)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        exact = ordered[int(q * len(ordered)) - 1]
        assert abs(got[name] - exact) <= 0.05 * exact, (name, got[name], exact)
    assert got["count"] == 20_000 and abs(got["sum"] - sum(values)) < 1e-6 * sum(values)
    assert got["max"] == max(values)


def test_the_window_slides_and_the_totals_do_not() -> None:
    lat = Latency(window=10.0)
    lat.swapped = 0.0
    for _ in range(100):
        lat.record(1.0)
    assert lat.summary(now=10.0)["p50"] > 0.9  # read, then swapped: 1 s is the previous window
    for _ in range(100):
        lat.record(0.01)
    assert lat.summary(now=15.0)["p99"] > 0.9  # both windows: the 1 s still count
    lat.summary(now=20.0)  # swapped again: the 1 s are gone
    got = lat.summary(now=21.0)
    assert got["p99"] < 0.011 and got["count"] == 200  # count and sum since the start
    empty = Latency(window=1.0)
    empty.record(0.5)
    assert empty.summary(now=empty.swapped + 1)["p50"] > 0.45  # swapped: now the previous window
    empty.summary(now=empty.swapped + 1)  # swapped again
    assert empty.summary(now=empty.swapped)["p50"] is None  # nothing in the window now


def test_notes_go_to_the_bound_stages_only() -> None:
    note("scoring", 1.0)  # none bound: nothing happens
    stages = Latencies()

    async def call() -> None:
        note_call("train", 0.25, 0.5)
        note_call("eval", 9.0, 9.0)  # evaluation calls have their own budget: not counted

    async def main() -> None:
        with stages.bind():
            await asyncio.create_task(call())  # a task started inside copies the binding

    asyncio.run(main())
    got = stages.summaries()
    assert set(got) == {"queue_wait", "server"}
    assert got["server"]["count"] == 1 and got["server"]["sum"] == 0.5
    assert got["queue_wait"]["sum"] == 0.25


def test_a_serving_env_reports_its_stages_to_stats_and_metrics(tmp_path) -> None:
    """The fake server takes 50 ms a call: the server stage's median is at least that, and
    a rollout (which waits for its call) no shorter."""
    with FakeInferenceServer(responder=solver, latency=0.05) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            trainer = Trainer(url)
            serve_until(fake.base_url, url, trainer, 3, tmp_path, 0.05, max_num_workers=2)
            doc = httpx.get(f"{url}/stats").json()["envs"]["0"]
            text = httpx.get(f"{url}/metrics").text
    latency = doc["latency"]
    assert {"rollout", "server", "queue_wait", "scoring"} <= set(latency)
    assert all(s["count"] >= 1 for s in latency.values())
    assert latency["server"]["p50"] >= 0.05 * 0.95  # within the histogram's half bucket
    assert latency["rollout"]["p50"] >= latency["server"]["p50"] * 0.95
    assert latency["queue_wait"]["p99"] < latency["server"]["p50"]  # 2 workers, 512 slots
    assert doc["paced_seconds"] == 0.0  # the API has no --max-staleness: never paced
    assert doc["env_outcomes"]["scored"] >= 1  # its outcome counts ride the same poll
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("latency/rollout_p50" in r and "latency/server_count" in r for r in records)
    assert "# TYPE atropos_env_latency_seconds summary" in text
    for stage in ("rollout", "server", "queue_wait", "scoring"):
        for q in ("0.5", "0.95", "0.99"):
            pattern = rf'atropos_env_latency_seconds{{env="0",stage="{stage}",quantile="{q}"}} \S+'
            assert re.search(pattern, text), (stage, q)
        assert re.search(rf'atropos_env_latency_seconds_count{{env="0",stage="{stage}"}} \d+', text)
        assert f'atropos_env_latency_seconds_sum{{env="0",stage="{stage}"}} ' in text
    assert 'atropos_env_paced_seconds_total{env="0"} 0.000' in text
    assert 'atropos_env_outcomes_total{env="0",outcome="scored",reason=""} ' in text
    for line in text.splitlines():  # every sample line: name{labels} value
        if line and not line.startswith("#"):
            assert re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+', line), line


def test_an_ending_env_leaves_the_api_its_final_counts(tmp_path) -> None:
    """Polled once, at the start (before any rollout): what the API shows after the run is the
    final report an ending env sends once its last group is out."""
    with FakeInferenceServer(responder=solver) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            trainer = Trainer(url)
            runner = serve_until(fake.base_url, url, trainer, 2, tmp_path, 3600.0,
                                 max_num_workers=2)  # fmt: skip
            doc = httpx.get(f"{url}/stats").json()["envs"]["0"]
    assert runner.outcomes["scored"] >= 8
    assert doc["env_outcomes"] == dict(runner.outcomes)
    assert doc["latency"]["rollout"]["count"] >= 1
