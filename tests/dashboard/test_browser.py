"""The dashboard in a real headless Chromium, against a live API started in a thread.

Drawn charts are checked by reading canvas pixels; the page runs under its own strict CSP, so
the tests wait with Playwright's locators and function predicates (never string eval).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from playwright.sync_api import expect

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import INJECTION, KEY, Tab, png_size_and_colors, registration, seed_run

FAST = "/dashboard?interval=200"
ACCENT, WARN = (0x2F, 0x6F, 0xDE), (0xE8, 0x59, 0x0C)  # env 0 and env 1 (and the queue series)

# Per canvas: whether it shows an empty state, and how many pixels are near each given colour.
COUNT_PIXELS = """([id, colors]) => {
  const c = document.getElementById(id);
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  const near = colors.map(() => 0);
  let painted = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] === 0) continue;
    painted++;
    colors.forEach(([r, g, b], k) => {
      if (Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 40) near[k]++;
    });
  }
  return {empty: c.dataset.empty, painted, near};
}"""


def pixels(page: Any, canvas: str, *colors: tuple[int, int, int]) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(COUNT_PIXELS, [canvas, [list(c) for c in colors]])
    return result


def test_a_live_run_is_drawn_and_model_text_stays_text(tab: Tab, tmp_path):
    page = tab.page
    config = ApiConfig(api_key=KEY, history_interval=0.1, max_staleness=0)
    with serve_in_thread(create_app(config)) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=auth) as client:
            seed_run(client)
            time.sleep(0.3)  # a few /stats/history samples after the traffic
        page.goto(f"{url}{FAST}#key={KEY}")
        expect(page.locator("#conn")).to_have_text("live")
        expect(page.locator("#step")).to_have_text("2")
        assert "#key" not in page.url and KEY not in page.url  # the key left the address bar
        expect(page.locator("#trainer")).to_contain_text("batch size 4")
        expect(page.locator("#banner")).to_be_hidden()

        # tiles: 2 batches served, 4 stale groups dropped, staleness 0..2 over 9 recent groups
        expect(page.locator("#drops-total")).to_have_text("4")
        expect(page.locator("#staleness")).to_have_text("1.6 / 2")
        expect(page.locator("#latency-sub")).to_contain_text("2 batches")
        envs = page.locator("#envs tbody tr")
        expect(envs).to_have_count(2)
        expect(envs.nth(0)).to_contain_text("alpha-env")
        expect(envs.nth(1)).to_contain_text("beta-env")

        # the rollout list: newest first; the injection is shown as text, never parsed
        rows = page.locator("#rollouts > li")
        expect(rows).to_have_count(9)
        expect(rows.first).to_contain_text("#9")
        injected = page.locator("#rollouts li[data-seq='3']")
        expect(injected.locator(".preview")).to_have_text(INJECTION)
        injected.locator("summary").click()
        body = injected.locator(".body")
        expect(body).to_contain_text("sequence 1 · score 1.000 · 4 tokens (2 trained)")
        expect(body.locator("pre.content").nth(1)).to_have_text(INJECTION)
        assert page.locator("#rollouts img, #rollouts script").count() == 0
        assert page.evaluate("() => window.__pwned") is None

        # the rollout list keeps an open row open across polls, and filters by env
        page.wait_for_timeout(500)
        assert injected.locator("details").evaluate("d => d.open") is True
        page.select_option("#rollout-env", "1")
        expect(rows).to_have_count(4)
        expect(page.locator("#rollouts")).not_to_contain_text("alpha-env")

        # charts: drawn (not empty states), in the expected colours
        queue = pixels(page, "chart-queue", ACCENT, WARN)
        assert queue["empty"] == "0" and min(queue["near"]) > 50, queue
        rate = pixels(page, "chart-rate", ACCENT, WARN)
        assert rate["empty"] == "0" and min(rate["near"]) > 30, rate
        scores = pixels(page, "chart-scores", ACCENT, WARN)
        assert scores["empty"] == "0" and min(scores["near"]) > 500, scores
        stale = pixels(page, "chart-staleness", ACCENT)
        assert stale["empty"] == "0" and stale["near"][0] > 1000, stale
        drops = pixels(page, "chart-drops", WARN)
        assert drops["empty"] == "0" and drops["near"][0] > 1000, drops
        expect(page.locator("#legend-rate")).to_contain_text("beta-env")

        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        width, height, colors = png_size_and_colors(shot.read_bytes())
        assert width == 1280 and height >= 900 and colors >= 16
    assert tab.errors == []


def test_an_empty_api_renders_empty_states(tab: Tab):
    page = tab.page
    with serve_in_thread(create_app(ApiConfig(history_interval=0.1))) as url:
        page.goto(url + FAST)
        expect(page.locator("#conn")).to_have_text("live")
        expect(page.locator("#step")).to_have_text("0")
        expect(page.locator("#trainer")).to_have_text("no trainer registered yet")
        expect(page.locator("#envs-empty")).to_be_visible()
        expect(page.locator("#rollouts-empty")).to_be_visible()
        expect(page.locator("#staleness-sub")).to_have_text("no rollouts yet")
        expect(page.locator("#latency-sub")).to_have_text("no batch served yet")
        expect(page.locator("#banner")).to_be_hidden()
        page.wait_for_timeout(400)  # several samples: the queue chart draws a flat line at 0
        assert pixels(page, "chart-queue")["empty"] == "0"
        for canvas in ("chart-rate", "chart-scores", "chart-staleness", "chart-drops"):
            found = pixels(page, canvas)
            assert found["empty"] == "1" and found["painted"] > 0, (canvas, found)
    assert tab.errors == []


def test_a_missing_key_and_a_dead_api_show_a_banner(tab: Tab):
    page = tab.page
    banner = page.locator("#banner")
    with serve_in_thread(create_app(ApiConfig(api_key=KEY, history_interval=0.1))) as url:
        page.goto(url + FAST)  # no #key=
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("needs a key (401)")
        expect(page.locator("#conn")).to_have_text("unauthorized")
        page.fill("#key-input", "wrong")
        page.click("#key-form button")
        expect(banner).to_contain_text("refused this key (401)")
        page.fill("#key-input", KEY)
        page.click("#key-form button")
        expect(banner).to_be_hidden()
        expect(page.locator("#conn")).to_have_text("live")
        page.reload()  # the key is kept for this tab (sessionStorage)
        expect(page.locator("#conn")).to_have_text("live")
    # the server is gone: the last figures stay, under a banner
    expect(banner).to_contain_text("Cannot reach the API")
    expect(page.locator("#conn")).to_have_text("offline")
    expect(page.locator("#step")).to_have_text("0")
    assert tab.errors == []


ENV_SIDE, FAILED_SIDE = (0xAE, 0x3E, 0xC9), (0xC9, 0x2A, 0x2A)  # env drops, env failures

# The environments table against its panel and the viewport: fully inside, or scrolling inside
# its panel (never cut off by the page).
TABLE_FIT = """() => {
  const box = document.getElementById("envs-scroll"), table = document.getElementById("envs");
  const card = box.closest(".card").getBoundingClientRect();
  const last = table.querySelector("thead th:last-child").getBoundingClientRect();
  const scroller = box.getBoundingClientRect();
  return {
    viewport: document.documentElement.clientWidth,
    pageScroll: document.documentElement.scrollWidth,
    card: [card.left, card.right], scroller: [scroller.left, scroller.right],
    last: [last.left, last.right],
    scrolls: box.scrollWidth > box.clientWidth, overflowX: getComputedStyle(box).overflowX,
  };
}"""


def report(client: httpx.Client, env_id: int, **counts: dict[str, int]) -> None:
    reply = client.post("/status-env", json={"env_id": env_id, **counts})
    assert reply.status_code == 200, reply.text


def test_env_reported_drops_show_beside_the_api_drops_and_the_table_fits(tab: Tab):
    page = tab.page
    config = ApiConfig(api_key=KEY, history_interval=0.1, max_staleness=0)
    with serve_in_thread(create_app(config)) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=auth) as client:
            envs = seed_run(client)  # the API dropped 4 stale groups
            alpha, beta = envs["alpha-env"], envs["beta-env"]
            report(client, alpha, dropped={"identical_scores": 17209, "too_long": 3})
            report(client, alpha, failed={"TimeoutError": 2})
            report(client, beta, dropped={"identical_scores": 5})
            client.get("/batch", params={"lease": 60})  # nothing to lease: one group waits
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(f"{url}{FAST}#key={KEY}")
        expect(page.locator("#conn")).to_have_text("live")

        # totals: both sides, named
        expect(page.locator("#drops-total")).to_have_text("17,221")
        expect(page.locator("#drops-sub")).to_have_text(
            "API 4 · envs 17,217 · 2 failed rollouts in envs"
        )
        legend = page.locator("#legend-drops")
        for side in ("dropped by the API", "dropped by an env", "failed rollouts in an env"):
            expect(legend).to_contain_text(side)
        drops = pixels(page, "chart-drops", WARN, ENV_SIDE, FAILED_SIDE)
        assert drops["empty"] == "0" and min(drops["near"]) > 60, drops  # small bars still show
        assert drops["near"][1] > 20 * max(drops["near"][0], drops["near"][2]), drops

        # per env: the API's drops, the env's drops and failures, and what each counts
        header = page.locator("#envs thead")
        for label in ("received", "batched", "waiting", "leased", "API dropped", "env dropped"):
            expect(header).to_contain_text(label)
        expect(header.locator("th").nth(9)).to_have_text("env failedrollouts")
        cells = page.locator("#envs tbody tr").nth(0).locator("td")
        expect(cells.nth(0)).to_contain_text("alpha-env")
        # received 6 (3 + 1 + 1 + the last), batched 2; the last group waits; none leased
        assert [cells.nth(i).inner_text() for i in range(2, 6)] == ["5", "2", "1", "0"]
        assert [cells.nth(i).inner_text() for i in (7, 8, 9)] == ["2", "17,212", "2"]
        assert "identical_scores: 17,209" in (cells.nth(8).get_attribute("title") or "")
        beta_cells = page.locator("#envs tbody tr").nth(1).locator("td")
        assert beta_cells.nth(8).inner_text() == "5" and beta_cells.nth(9).inner_text() == "0"
        expect(page.locator("#queued-sub")).to_have_text(
            "1 waiting · 0 in 0 leased batches · 2 sequences"
        )
        expect(page.locator("#envs-explain")).to_contain_text("leased groups are both batched")

        # the table is never cut off: at 1400 px it fits its panel; at 1000 px it fits or
        # scrolls inside the panel, and the page itself never scrolls sideways
        fit = page.evaluate(TABLE_FIT)
        assert fit["last"][1] <= fit["card"][1] <= fit["viewport"], fit
        assert not fit["scrolls"] and fit["pageScroll"] <= fit["viewport"], fit
        page.set_viewport_size({"width": 1000, "height": 900})
        page.wait_for_timeout(300)
        fit = page.evaluate(TABLE_FIT)
        assert fit["card"][1] <= fit["viewport"] and fit["pageScroll"] <= fit["viewport"], fit
        assert fit["overflowX"] == "auto"
        assert fit["scrolls"] or fit["last"][1] <= fit["scroller"][1], fit
    assert tab.errors == []


def test_no_drops_on_either_side_says_so(tab: Tab):
    page = tab.page
    with serve_in_thread(create_app(ApiConfig(history_interval=0.1))) as url:
        with httpx.Client(base_url=url) as client:
            client.post("/register", json=registration(4))
            client.get("/batch")
            env = {"max_token_length": 2048, "desired_name": "e", "weight": 1.0, "group_size": 2}
            env_id = client.post("/register-env", json=env).json()["env_id"]
            report(client, env_id, dropped={}, failed={})
        page.goto(url + FAST)
        expect(page.locator("#conn")).to_have_text("live")
        expect(page.locator("#drops-total")).to_have_text("0")
        expect(page.locator("#drops-sub")).to_have_text("none")
        assert pixels(page, "chart-drops")["empty"] == "1"
        row = page.locator("#envs tbody tr").first.locator("td")
        assert row.nth(8).inner_text() == "0"  # reported: zero, not "no report"
        with httpx.Client(base_url=url) as client:
            report(client, env_id, dropped={"too_easy": 1})
        expect(page.locator("#drops-sub")).to_have_text("API 0 · envs 1")
        expect(page.locator("#legend-drops")).to_have_text("dropped by an env (its report)")
    assert tab.errors == []
