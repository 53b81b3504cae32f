"""The dashboard's "Latency" panel in headless Chromium: each env's stages (p50, p95, p99, max,
count) and its paced seconds, as its last `/status-env` report gave them."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import KEY, Tab, seed_run

LATENCY = {
    "rollout": {"count": 1200, "sum": 900.0, "p50": 0.61, "p95": 1.9, "p99": 3.2, "max": 4.0},
    "queue_wait": {"count": 5, "sum": 0.01, "p50": 0.0004, "p95": 0.002, "p99": 0.002,
                   "max": 0.002},
}  # fmt: skip


def test_latency_shows_per_env_and_stage(tab: Tab) -> None:
    page = tab.page
    with serve_in_thread(create_app(ApiConfig(api_key=KEY, history_interval=0.1))) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=auth) as client:
            env_id = seed_run(client)["alpha-env"]
            body = {"env_id": env_id, "latency": LATENCY, "paced_seconds": 12.5}
            reply = client.post("/status-env", json=body)
            assert reply.status_code == 200, reply.text
        page.goto(f"{url}/dashboard?interval=200#key={KEY}")
        expect(page.locator("#conn")).to_have_text("live")
        rows = page.locator("#stages tbody tr")
        expect(rows).to_have_count(2)
        first = [rows.nth(0).locator("td").nth(i).inner_text() for i in range(8)]
        assert "alpha-env" in first[0]
        assert first[1:] == ["rollout", "610.0 ms", "1.90 s", "3.20 s", "4.00 s", "1,200", "12.5 s"]
        second = [rows.nth(1).locator("td").nth(i).inner_text() for i in range(1, 4)]
        assert second == ["queue_wait", "0.40 ms", "2.00 ms"]
        expect(page.locator("#stages-empty")).to_be_hidden()
    assert tab.errors == []
