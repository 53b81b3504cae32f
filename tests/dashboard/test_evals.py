"""The dashboard's "Evaluations" panel in headless Chromium: each env's metrics by policy
version, as it posted them to `/eval_results` (`--env.eval_every`), and the versions skipped."""

from __future__ import annotations

from playwright.sync_api import expect

from .conftest import Tab, live_dashboard

EVALS = [
    ("/eval_results", {"policy_version": version, "seconds": 3.0,
                       "metrics": {"eval/accuracy": acc}, "skipped": skipped})
    for version, acc, skipped in ((2, 0.25, 0), (4, 0.5, 1))
]  # fmt: skip


def test_evals_show_metric_by_version(tab: Tab) -> None:
    page = tab.page
    with live_dashboard(tab, EVALS):
        rows = page.locator("#evals tbody tr")
        expect(rows).to_have_count(1)
        heads = page.locator("#evals thead th")
        assert [heads.nth(i).inner_text() for i in range(4)] == ["env", "metric", "v2", "v4"]
        cells = [rows.nth(0).locator("td").nth(i).inner_text() for i in range(4)]
        assert "alpha-env" in cells[0]
        assert cells[1:] == ["eval/accuracy", "0.250", "0.500"]
        expect(page.locator("#evals-skipped")).to_contain_text("1 version skipped")
        expect(page.locator("#evals-empty")).to_be_hidden()
    assert tab.errors == []
