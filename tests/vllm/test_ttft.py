"""Real vLLM's own time-to-first-token and queue-time histograms fill an env's `ttft` and
`server_queue` stages and the server's report row (`atropos.inference.server_metrics`)."""

from __future__ import annotations

import asyncio
import time

from atropos.inference.config import APIServerConfig
from atropos.inference.latency import Latencies
from atropos.inference.manager import ServerManager
from atropos.testing.vllm import VLLMServer


def test_vllm_histograms_fill_the_ttft_stage(vllm_server: VLLMServer) -> None:
    stages = Latencies()
    config = APIServerConfig(
        base_url=vllm_server.base_url, server_type="vllm", model_name="atropos-tiny"
    )

    async def main() -> ServerManager:
        manager = ServerManager([config])
        await manager.server_metrics.poll(stages, now=0.0)  # the baseline
        await asyncio.gather(
            *(manager.completion(prompt="1 + 1 =", max_tokens=4) for _ in range(4))
        )
        deadline = time.monotonic() + 30  # vLLM records its stats as it streams its outputs
        now = 0.0
        while time.monotonic() < deadline and stages.stages["ttft"].count < 4:
            now += 10.0
            await manager.server_metrics.poll(stages, now=now)
            await asyncio.sleep(0.2)
        await manager.aclose()
        return manager

    manager = asyncio.run(main())
    got = stages.summaries()
    assert got["ttft"]["count"] >= 4 and 0 < got["ttft"]["p50"] <= got["ttft"]["p99"] < 60
    assert got["server_queue"]["count"] >= 4
    row = manager.server_report()[0]
    assert 0 < row["ttft_p50"] <= row["ttft_p99"]
