"""The dashboard's "Inference servers" panel in headless Chromium: each env's servers as its
last `/status-env` report gave them (in flight, the cap in force against the max, sessions,
the server's queue and KV cache)."""

from __future__ import annotations

from playwright.sync_api import expect

from .conftest import Tab, live_dashboard

SERVERS = [
    {"url": "http://127.0.0.1:9001/v1", "healthy": True, "in_flight": 12, "capacity": 24,
     "max": 512, "sessions": 30, "waiting": 0.0, "kv_usage": 0.41},
    {"url": "http://127.0.0.1:9002/v1", "healthy": False, "in_flight": 0, "capacity": 4,
     "max": 512},
]  # fmt: skip


def test_servers_show_per_env(tab: Tab) -> None:
    page = tab.page
    with live_dashboard(tab, [("/status-env", {"servers": SERVERS})]):
        rows = page.locator("#servers tbody tr")
        expect(rows).to_have_count(2)
        first = [rows.nth(0).locator("td").nth(i).inner_text() for i in range(9)]
        assert "alpha-env" in first[0]
        assert first[1:] == [
            "http://127.0.0.1:9001/v1",
            "healthy",
            "12",
            "24",
            "512",
            "30",
            "0",
            "41%",
        ]
        second = [rows.nth(1).locator("td").nth(i).inner_text() for i in range(2, 9)]
        assert second == ["unhealthy", "0", "4", "512", "0", "\u2013", "\u2013"]
        expect(page.locator("#servers-empty")).to_be_hidden()
    assert tab.errors == []
