"""The page in a real browser (Debian's chromium through Playwright): search, filters, sort,
token highlighting, and injected markup that stays text. Skipped when either is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atropos.view import write_page
from atropos.view.tokens import expand_runs

from .conftest import INJECTIONS, chat_group, page_json, write_jsonl

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):  # pragma: no cover - depends on the machine
    pytest.skip(f"no {CHROMIUM}", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def page_file(tmp_path_factory, tiny) -> Path:
    d = tmp_path_factory.mktemp("page")
    rows: list = []
    for k in range(12):
        rows.append(
            chat_group(
                tiny,
                [f"apple {k}" if k % 3 == 0 else f"pear {k}", "```py\nprint(4)\n```"],
                [k / 10, -k / 10 if k % 2 else 0.0],
                env_id=k % 2,
                overrides=[{"finish_reason": "length" if k == 5 else "stop"}, {}],
            )
        )
    rows.append(chat_group(tiny, INJECTIONS, [9.0, 9.0, 9.0, 9.0], env_id=0))
    rows.insert(4, "{not json")
    rows.insert(6, {"tokens": [[1]]})
    path = write_jsonl(d / "run.jsonl", rows)
    return write_page([path], d / "run.html", tokenizer=tiny, tokenizer_name="tiny")


@pytest.fixture()
def page(browser, page_file):
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(page_file.as_uri())
    pg.wait_for_selector("body[data-ready='1']")
    yield pg
    assert pg.evaluate("window.__pwned") is None  # no injected script or handler ever ran
    assert errors == []
    assert requests == [page_file.as_uri()]  # nothing fetched but the page itself
    pg.close()


def shown(pg) -> int:
    return int(pg.get_attribute("body", "data-shown"))


def search(pg, text: str) -> None:
    pg.fill("#q", text)
    pg.wait_for_function(f"document.getElementById('q').value === {text!r}")
    pg.wait_for_timeout(250)  # the search box waits 120 ms for the typing to stop


def test_search_filters_groups_and_marks_matches(page):
    assert page.inner_text("#count") == "showing 13 of 13 groups (28 sequences)"
    page.click("#q")
    page.keyboard.type("APPLE")
    page.wait_for_timeout(250)
    assert shown(page) == 4  # groups 0, 3, 6, 9
    assert page.inner_text("#count").startswith("showing 4 of 13 groups")
    first = page.locator("details.group:not([hidden])").first
    first.locator("summary").click()
    first.locator("mark").first.wait_for()
    assert first.locator("mark").first.inner_text() == "apple"
    search(page, "no such text")
    assert shown(page) == 0
    search(page, "")
    assert shown(page) == 13


def test_injected_markup_is_visible_as_text(page):
    search(page, "__pwned")
    assert shown(page) == 1
    group = page.locator("details.group:not([hidden])")
    group.locator("summary").click()
    group.locator(".body").wait_for()
    text = group.inner_text()
    for injected in INJECTIONS[:3]:
        assert injected in text
    assert group.locator("script, img, iframe").count() == 0
    assert page.locator("script").count() == 2


def test_score_env_finish_and_overrides_filters(page):
    page.fill("#smin", "0.5")
    assert shown(page) == 2  # means: k/20 for even k (k = 10 reaches 0.5), 0 for odd; 9.0
    page.fill("#smax", "1")
    assert shown(page) == 1
    page.fill("#smin", "")
    page.fill("#smax", "")
    page.select_option("#env", "1")
    assert shown(page) == 6
    page.select_option("#env", "")
    assert page.is_visible("#finish-label")
    page.select_option("#finish", "length")
    assert shown(page) == 1
    assert "#6" in page.locator("details.group:not([hidden]) summary").inner_text()
    page.select_option("#finish", "")
    page.check("#ovr")
    assert shown(page) == 12  # the injection group has no overrides


def test_sort_by_mean_max_and_spread(page, page_file):
    data = page_json(page_file.read_text())

    def order():
        return [
            int(t.split()[0].lstrip("#")) - 1
            for t in page.locator("details.group summary .gi").all_inner_texts()
        ]

    assert order() == list(range(13))
    for value, key, sign in [
        ("mean-desc", "mean", -1),
        ("mean-asc", "mean", 1),
        ("max-desc", "max", -1),
        ("spread-desc", "spread", -1),
    ]:
        page.select_option("#sort", value)
        expected = sorted(range(13), key=lambda i: (sign * data["groups"][i]["stats"][key], i))
        assert order() == expected, value


def test_banner_counts_bad_lines(page):
    banner = page.inner_text("#bad-lines")
    assert "2 lines were skipped" in banner
    assert "run.jsonl:5: invalid JSON" in banner and "run.jsonl:7: not a group" in banner


def test_trained_tokens_are_highlighted_from_the_masks(page, page_file):
    data = page_json(page_file.read_text())
    group = page.locator("details.group").first
    group.locator("summary").click()
    tokens = group.locator("details.tokens").first
    tokens.locator("summary").click()
    tokens.locator(".toks span").first.wait_for()
    spans = tokens.locator(".toks span")
    seq = data["groups"][0]["seqs"][0]
    classes = spans.evaluate_all("els => els.map(e => e.classList.contains('t'))")
    assert classes == expand_runs(seq["runs"])
    assert "".join(spans.all_text_contents()) == "".join(seq["pieces"])
    trained = "".join(tokens.locator(".toks span.t").all_text_contents())
    assert trained.startswith("apple 0")


def test_code_blocks_render_as_pre_and_keys_move_between_groups(page):
    page.keyboard.press("j")
    page.keyboard.press("o")
    first = page.locator("details.group").first
    assert first.get_attribute("open") is not None
    first.locator("pre.code").first.wait_for()
    assert first.locator("pre.code code").first.inner_text() == "print(4)"
    page.keyboard.press("j")
    assert "current" in page.locator("details.group").nth(1).get_attribute("class")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "q"


def test_collapsed_rows_preview_the_prompt_and_the_best_answer(page):
    first = page.locator("details.group").first
    assert first.get_attribute("open") is None
    assert first.locator("summary .pvtext").all_inner_texts() == ["What is 2 + 2?", "apple 0"]
    assert first.locator("summary .pvlabel").nth(1).inner_text() == "best answer (0)"
    second = page.locator("details.group").nth(1)  # scores 0.1 and -0.1: the first is best
    assert second.locator("summary .pvtext").nth(1).inner_text() == "pear 1"
    # each preview is one line, whatever the text
    heights = page.locator("summary .pv").evaluate_all("els => els.map(e => e.clientHeight)")
    assert heights and max(heights) <= 24, heights
    # model text in a preview is text: the injection group shows its markup as written
    injected = page.locator("details.group").nth(12).locator("summary")
    assert injected.locator(".pvtext").nth(1).text_content() == INJECTIONS[0]
    assert injected.locator("script, img").count() == 0


def test_an_opened_group_shows_the_shared_prompt_once_then_each_answer(page):
    first = page.locator("details.group").first
    first.locator("summary").click()
    body = first.locator(".body")
    body.wait_for()
    shared = body.locator(".shared")
    assert "shared by all 2 sequences" in shared.locator(".sharedhead").inner_text()
    assert shared.locator(".msg").count() == 1
    assert body.inner_text().count("What is 2 + 2?") == 1  # not once per sequence
    seqs = body.locator(".seq")
    assert seqs.count() == 2
    assert [seqs.nth(i).locator(".msg").count() for i in range(2)] == [1, 1]
    assert seqs.nth(0).locator(".msg .role").inner_text() == "assistant"
    assert "apple 0" in seqs.nth(0).inner_text()
    assert seqs.nth(1).locator("pre.code code").inner_text() == "print(4)"
    assert seqs.nth(0).locator(".best").count() == 1 and seqs.nth(1).locator(".best").count() == 0
