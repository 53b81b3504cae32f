"""An env's inference servers, sent with `/status-env` (`ServerManager.server_report()`), shown
per env in `/stats` and as `atropos_env_server_*` gauges in `/metrics`; a bad report refused."""

from __future__ import annotations

import asyncio
import json

import httpx

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager

ENV = {"max_token_length": 2048, "desired_name": "env", "weight": 1.0, "group_size": 2}


def report() -> list[dict[str, object]]:
    """A real manager's report: two servers, adaptive concurrency on (floor 4 of 512)."""
    configs = [
        APIServerConfig(base_url=f"http://127.0.0.1:{port}/v1", server_type="vllm")
        for port in (9, 10)
    ]
    settings = ServerManagerConfig(adaptive_concurrency=True)

    async def main() -> list[dict[str, object]]:
        async with ServerManager(configs, settings) as m:
            m._pool.slots[1].limit.waiting = 3.0  # type: ignore[union-attr]
            return m.server_report()

    return asyncio.run(main())


def test_servers_show_in_stats_and_metrics(client: httpx.Client) -> None:
    env_id = client.post("/register-env", json=ENV).json()["env_id"]
    servers = report()
    assert servers[0]["capacity"] == 4 and servers[0]["max"] == 512
    got = client.post("/status-env", json={"env_id": env_id, "servers": servers})
    assert got.status_code == 200
    shown = client.get("/stats").json()["envs"][str(env_id)]["servers"]
    assert [s["url"] for s in shown] == ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    assert shown[1]["waiting"] == 3.0 and shown[0]["in_flight"] == 0
    text = client.get("/metrics").text
    assert f'atropos_env_server_capacity{{env="{env_id}",server="http://127.0.0.1:9/v1"}} 4' in text
    assert f'atropos_env_server_max{{env="{env_id}",server="http://127.0.0.1:10/v1"}} 512' in text
    assert f'atropos_env_server_waiting{{env="{env_id}",server="http://127.0.0.1:10/v1"}} 3' in text

    # a report without servers keeps the last view; a new one replaces it
    client.post("/status-env", json={"env_id": env_id, "dropped": {"x": 1}})
    assert len(client.get("/stats").json()["envs"][str(env_id)]["servers"]) == 2
    client.post("/status-env", json={"env_id": env_id, "servers": servers[:1]})
    assert len(client.get("/stats").json()["envs"][str(env_id)]["servers"]) == 1


def test_a_bad_server_report_is_refused_naming_the_field(client: httpx.Client) -> None:
    env_id = client.post("/register-env", json=ENV).json()["env_id"]
    bad = {"url": "u", "healthy": True, "in_flight": -1, "capacity": 1, "max": 1}
    got = client.post("/status-env", content=json.dumps({"env_id": env_id, "servers": [bad]}))
    assert got.status_code == 422 and "servers" in got.text and "in_flight" in got.text
