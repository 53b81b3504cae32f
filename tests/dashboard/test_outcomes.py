"""The dashboard's "Outcomes" panel in headless Chromium: each env's rollouts by outcome and
reason, most first, with their share, as its last `/status-env` report gave them."""

from __future__ import annotations

from playwright.sync_api import expect

from .conftest import Tab, live_dashboard

OUTCOMES = {"scored": 150, "failed/judge_timeout": 40, "truncated/turns": 10}


def test_outcomes_show_per_env_and_reason(tab: Tab) -> None:
    page = tab.page
    with live_dashboard(tab, [("/status-env", {"outcomes": OUTCOMES})]):
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
