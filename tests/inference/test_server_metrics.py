"""Time to first token and server queue time from the servers' own Prometheus histograms
(`atropos.inference.server_metrics`): the bucket growth between reads lands in the right
bucket, per server and merged into the env's stages; a server without the histograms leaves
the stages empty; an unreachable one is logged once and retried, never fatal."""

from __future__ import annotations

import asyncio
import logging

import pytest

from atropos.api import ApiConfig, create_app
from atropos.inference.concurrency import Histogram, parse_histograms
from atropos.inference.config import APIServerConfig
from atropos.inference.latency import Latencies
from atropos.inference.manager import ServerManager
from atropos.inference.server_metrics import NAMES, ServerMetrics, growth
from atropos.net import free_port
from atropos.testing import FakeInferenceServer, serve_in_thread

VLLM_TEXT = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""


def test_histograms_are_summed_over_engines() -> None:
    got = parse_histograms(VLLM_TEXT, NAMES)["vllm:time_to_first_token_seconds"]
    assert got.buckets == [(0.1, 3.0), (float("inf"), 4.0)]
    assert (got.sum, got.count) == (1.5, 4.0)


def config(url: str, server_type: str = "vllm") -> APIServerConfig:
    return APIServerConfig(base_url=url, server_type=server_type, model_name="atropos-tiny")


def test_ttft_lands_in_its_bucket_per_server_and_in_the_env_stage() -> None:
    """The fake takes 0.3 s a call: vLLM's bucket (0.25, 0.5]; it has no queue: ~0 s."""
    stages = Latencies()
    with FakeInferenceServer(latency=0.3) as fake:
        manager = ServerManager([config(fake.base_url)])
        metrics = manager.server_metrics

        async def main() -> None:
            await metrics.poll(stages, now=0.0)  # the baseline: nothing noted
            assert stages.summaries() == {}
            calls = [manager.completion(prompt="hi", max_tokens=3) for _ in range(5)]
            await asyncio.gather(*calls)
            await metrics.poll(stages, now=0.5)  # within INTERVAL: not read
            assert stages.summaries() == {}
            await metrics.poll(stages, now=2.0)
            await manager.aclose()

        asyncio.run(main())
    got = stages.summaries()
    assert got["ttft"]["count"] == 5 and 0.25 < got["ttft"]["p50"] <= 0.5
    assert 0.25 < got["ttft"]["p99"] <= 0.5
    assert got["server_queue"]["count"] == 5 and got["server_queue"]["p99"] < 0.01
    row = manager.server_report()[0]
    assert 0.25 < row["ttft_p50"] <= row["ttft_p95"] <= row["ttft_p99"] <= 0.5


def test_a_server_without_histograms_leaves_the_stages_empty(caplog) -> None:
    """The API's own /metrics has no vLLM histogram; an openai server is never read."""
    stages = Latencies()
    with serve_in_thread(create_app(ApiConfig())) as url:
        metrics = ServerMetrics([config(url + "/v1"), config(url + "/v1", "openai")])

        async def main() -> None:
            with caplog.at_level(logging.INFO, "atropos.inference.server_metrics"):
                await metrics.poll(stages, now=0.0)
                await metrics.poll(stages, now=5.0)

        asyncio.run(main())
    assert stages.summaries() == {} and metrics.row(0) == {} and metrics.row(1) == {}
    assert not metrics.servers[0].read and not metrics.servers[1].read
    assert sum("serves no time-to-first-token" in r.message for r in caplog.records) == 1


def test_an_unreachable_server_is_logged_once_and_retried(caplog) -> None:
    port = free_port()
    metrics = ServerMetrics([config(f"http://127.0.0.1:{port}/v1")])

    async def main() -> None:
        with caplog.at_level(logging.INFO, "atropos.inference.server_metrics"):
            for t in range(3):
                await metrics.poll(None, now=10.0 * t)

    asyncio.run(main())
    assert metrics.servers[0].read and metrics.servers[0].failing
    assert sum("failed (will retry)" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("restart", [False, True])
def test_counts_that_fall_start_a_new_baseline(restart: bool) -> None:
    before = Histogram([(0.1, 5.0), (float("inf"), 6.0)], 1.0, 6.0)
    after = Histogram([(0.1, 1.0 if restart else 7.0), (float("inf"), 8.0)], 1.2, 8.0)
    assert growth(before, after) == (None if restart else [(0.0, 0.1, 2)])


def test_a_hung_server_holds_its_own_read_never_the_caller() -> None:
    """`poll_soon` (the env's status poll) returns at once; the read waits in a task of its
    own, one at a time, and `aclose` ends it."""

    async def main() -> None:
        held: list[asyncio.StreamWriter] = []  # accepted, never answered

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)

        hung = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = hung.sockets[0].getsockname()[1]
        metrics = ServerMetrics([config(f"http://127.0.0.1:{port}/v1")])
        metrics.poll_soon(None)
        first = metrics.polling
        assert first is not None and not first.done()
        await asyncio.sleep(0.2)
        assert not first.done()  # waiting for the hung server (its deadline is 2 s)
        metrics.due = 0.0  # due again: still no second read while the first runs
        metrics.poll_soon(None)
        assert metrics.polling is first
        await metrics.aclose()
        assert first.cancelled() and metrics.polling is None
        hung.close()
        await hung.wait_closed()

    asyncio.run(main())
