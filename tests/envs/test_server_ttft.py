"""A serving env's `ttft` and `server_queue` stages come from its servers' own histograms
(`atropos.inference.server_metrics`): against the fake (vLLM's histograms on `/metrics`, 0.3 s
a call), the API's `/stats` shows the env's TTFT in vLLM's (0.25, 0.5] bucket and the server's
TTFT quantiles in its servers report."""

from __future__ import annotations

import asyncio
import time

import httpx

from atropos.api import ApiConfig, create_app
from atropos.envs.runner.serve import ServeRunner
from atropos.testing import FakeInferenceServer, serve_in_thread

from .arith import solver
from .test_policy_version import make
from .test_runner import Trainer


def serve_until_ttft(fake_url: str, url: str, tmp_path) -> dict:
    """Serve until the API's /stats shows the env's ttft stage (deadline 60 s); its doc."""
    trainer = Trainer(url)
    trainer.start()
    env, resolved = make(
        fake_url, mode="serve", rollout_server_url=url, register_timeout=30,
        ensure_scores_are_not_same=False, max_num_workers=2,
    )  # fmt: skip
    runner = ServeRunner(env, resolved, tmp_path)
    runner.status_interval = 0.05

    async def main() -> dict:
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + 60
        doc: dict = {}
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline and not task.done():
                doc = (await client.get(f"{url}/stats")).json()["envs"].get("0", {})
                if doc.get("latency", {}).get("ttft") and doc["servers"][0].get("ttft_p50"):
                    break
                await asyncio.sleep(0.1)
        runner.stopping.set()
        assert await task == 0
        return doc

    try:
        return asyncio.run(main())
    finally:
        trainer.stop.set()
        trainer.join(5)


def test_stats_show_the_servers_ttft(tmp_path) -> None:
    with FakeInferenceServer(responder=solver, latency=0.3) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            doc = serve_until_ttft(fake.base_url, url, tmp_path)
            text = httpx.get(f"{url}/metrics").text
    ttft = doc["latency"]["ttft"]
    assert ttft["count"] >= 1 and 0.25 < ttft["p50"] <= ttft["p99"] <= 0.5
    assert doc["latency"]["server_queue"]["p99"] < 0.01  # the fake has no queue
    server = doc["servers"][0]
    assert 0.25 < server["ttft_p50"] <= server["ttft_p99"] <= 0.5
    assert 'atropos_env_latency_seconds{env="0",stage="ttft",quantile="0.5"} ' in text
