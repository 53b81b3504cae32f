"""The dashboard's "Outcomes" panel in headless Chromium: each env's rollouts by outcome and
reason, most first, with their share, as its last `/status-env` report gave them."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import KEY, Tab, seed_run

OUTCOMES = {"scored": 150, "failed/judge_timeout": 40, "truncated/turns": 10}


def test_outcomes_show_per_env_and_reason(tab: Tab) -> None:
    page = tab.page
    with serve_in_thread(create_app(ApiConfig(api_key=KEY, history_interval=0.1))) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=auth) as client:
            env_id = seed_run(client)["alpha-env"]
            reply = client.post("/status-env", json={"env_id": env_id, "outcomes": OUTCOMES})
            assert reply.status_code == 200, reply.text
        page.goto(f"{url}/dashboard?interval=200#key={KEY}")
        expect(page.locator("#conn")).to_have_text("live")
        rows = page.locator("#outcomes tbody tr")
        expect(rows).to_have_count(3)
        cells = [
            [rows.nth(r).locator("td").nth(i).inner_text() for i in range(5)] for r in range(3)
        ]
        assert "alpha-env" in cells[0][0]
        assert cells[0][1:] == ["scored", "\u2013", "150", "75.0%"]
        assert cells[1][1:] == ["failed", "judge_timeout", "40", "20.0%"]
        assert cells[2][1:] == ["truncated", "turns", "10", "5.0%"]
        expect(page.locator("#outcomes-empty")).to_be_hidden()
    assert tab.errors == []
