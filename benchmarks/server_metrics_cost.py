"""What reading a server's TTFT and queue-time histograms costs the env
(`atropos.inference.server_metrics`), in process CPU time.

Per read: `ServerHistograms.take` (parse the `/metrics` text for the four histogram names and
note the buckets' growth into the env's stages and the server's own) on a vLLM-shaped text of
about 1,000 lines (16 other histograms of 30 buckets on 2 engines, as many gauges and counters,
and the two histograms read; larger than vLLM 0.32's own page with one engine), growing 64
observations a read; then a whole `ServerMetrics.poll` of one `FakeInferenceServer` (HTTP GET
on a new loopback connection, parse, note).

    nice -n 10 .venv/bin/python benchmarks/server_metrics_cost.py
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from atropos.inference.config import APIServerConfig
from atropos.inference.latency import Latencies
from atropos.inference.server_metrics import ServerHistograms, ServerMetrics
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_metrics import FakeMetrics

READS = 2_000


def vllm_text(metrics: FakeMetrics) -> str:
    """A vLLM-shaped page: filler histograms and gauges around the two histograms read."""
    lines = []
    for h in range(16):
        for engine in range(2):
            labels = f'engine="{engine}",model_name="atropos-tiny"'
            lines += [f'vllm:other_{h}_bucket{{{labels},le="{b}"}} {b * 7}' for b in range(30)]
            lines += [f"vllm:other_{h}_sum{{{labels}}} 1.0", f"vllm:other_{h}_count{{{labels}}} 9"]
    lines += [f'vllm:gauge_{g}{{engine="0",model_name="atropos-tiny"}} {g}' for g in range(16)]
    lines += [f"# HELP vllm:gauge_{g} filler" for g in range(16)]
    return "\n".join(lines) + "\n" + metrics.render()


def main() -> None:
    rng = random.Random(0)
    config = APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="vllm")
    server, stages, metrics = ServerHistograms(config, 60.0), Latencies(), FakeMetrics("m")
    texts = []
    for _ in range(READS):
        for _ in range(64):
            metrics.answered(rng.lognormvariate(-2.0, 1.0))
        texts.append(vllm_text(metrics))
    start = time.process_time()
    for text in texts:
        server.take(text, stages)
    take = (time.process_time() - start) / READS * 1e6
    print(f"load average {os.getloadavg()[0]:.2f}; page {len(texts[0].splitlines())} lines")
    print(f"take (parse + note 64 observations): {take:.0f} us a read")
    with FakeInferenceServer() as fake:
        polls = ServerMetrics([APIServerConfig(base_url=fake.base_url, server_type="vllm")])

        async def run() -> float:
            start = time.process_time()
            for i in range(200):
                await polls.poll(stages, now=10.0 * i)
            return (time.process_time() - start) / 200 * 1e6

        print(f"poll of one fake server (HTTP GET + parse + note): {asyncio.run(run()):.0f} us")


if __name__ == "__main__":
    main()
