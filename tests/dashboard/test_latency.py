"""The dashboard's "Latency" panel in headless Chromium: each env's stages (p50, p95, p99, max,
count) and its paced seconds, as its last `/status-env` report gave them."""

from __future__ import annotations

from playwright.sync_api import expect

from .conftest import Tab, live_dashboard

LATENCY = {
    "rollout": {"count": 1200, "sum": 900.0, "p50": 0.61, "p95": 1.9, "p99": 3.2, "max": 4.0},
    "queue_wait": {"count": 5, "sum": 0.01, "p50": 0.0004, "p95": 0.002, "p99": 0.002,
                   "max": 0.002},
}  # fmt: skip


def test_latency_shows_per_env_and_stage(tab: Tab) -> None:
    page = tab.page
    with live_dashboard(tab, [("/status-env", {"latency": LATENCY, "paced_seconds": 12.5})]):
        rows = page.locator("#stages tbody tr")
        expect(rows).to_have_count(2)
        first = [rows.nth(0).locator("td").nth(i).inner_text() for i in range(8)]
        assert "alpha-env" in first[0]
        assert first[1:] == ["rollout", "610.0 ms", "1.90 s", "3.20 s", "4.00 s", "1,200", "12.5 s"]
        second = [rows.nth(1).locator("td").nth(i).inner_text() for i in range(1, 4)]
        assert second == ["queue_wait", "0.40 ms", "2.00 ms"]
        expect(page.locator("#stages-empty")).to_be_hidden()
    assert tab.errors == []
