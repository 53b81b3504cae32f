"""A real Chromium opens an attacker's page on another loopback port; the page throws every
simple cross-site request it can at the rollout proxy as it runs by default (loopback, no
proxy key), over a fake inference server: it creates sessions (ours and upstream's), lists them
and reads a trajectory with an `<img>` and a `<script src>`, calls the dialects of a session
the test made (by its public id) and of an upstream session (by its `uuid`, as if leaked: that
route needs no key), sets a reward, all as `no-cors` text/plain fetches, bodiless Blobs,
text/plain forms and beacons; and it tries a `DELETE` and a JSON `POST`, which need a
preflight. The proxy sees the requests arrive and changes nothing: the same two sessions, each
with its turns and no reward, and no generation request reached the inference server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from atropos.proxy.app import Proxy, build_app
from atropos.testing import FakeInferenceServer, serve_in_thread

from .helpers import make_proxy

HELLO: Any = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "messages": HELLO, "max_tokens": 8}
GENERATION = ("/v1/completions", "/v1/chat/completions", "/generate", "/generate/")
ATTACK = """const load = (tag, path) => waits.push(new Promise(done => {
  const el = document.createElement(tag);
  el.onload = el.onerror = done;
  setTimeout(done, 4000);
  el.src = api + path;
  document.body.appendChild(el);
}));
for (const [path, doc] of plan.posts) {
  const body = JSON.stringify(doc);
  text(path, body);
  blob(path, body);
  form(path, doc);
  results["beacon " + path] = navigator.sendBeacon(
    api + path, new Blob([body], {type: "text/plain"}));
}
for (const path of plan.gets) {
  load("img", path);
  load("script", path);
}
for (const path of plan.deletes) {
  settle("cors DELETE " + path, fetch(api + path, {method: "DELETE"}));
}
for (const [path, doc] of plan.json) {
  settle("cors json " + path, fetch(api + path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(doc)}));
}
Promise.all(waits).then(() => setTimeout(() => { window.__results = results; }, 500));
</script></body></html>"""


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=lambda prompt: "hello") as server:
        yield server


def state(proxy: Proxy) -> dict[str, tuple[int, Any, int, bool]]:
    """Each session the proxy holds: its turns, reward, sequences and whether it finished."""
    return {
        sid: (s.turns, s.reward, len(s.trajectory().to_dict()["sequences"]), s.finished)
        for sid, s in proxy.sessions.items()
    }


def test_an_attackers_page_in_chromium_changes_nothing_on_the_proxy(
    attacker_site, attack_page, browser, recorder, fake
):
    """`attacker_site`, `attack_page`, `browser`, `recorder`: tests/conftest.py."""
    folder, origin = attacker_site
    proxy = make_proxy(fake.base_url)  # no proxy key: a default run on one machine
    app = recorder(build_app(proxy))
    with serve_in_thread(app) as url:
        ours = httpx.post(f"{url}/sessions", json={}).json()
        client = openai.OpenAI(base_url=ours["base_url"], api_key=ours["api_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
        uuid = httpx.post(f"{url}/sessions/create", json={"tool_parser": "hermes"}).json()["uuid"]
        client = openai.OpenAI(base_url=f"{url}/{uuid}/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
        before = state(proxy)
        assert len(before) == 2 and {turns for turns, *_ in before.values()} == {1}
        sid = ours["id"]
        plan = {
            "posts": [
                ("/sessions", {}),
                ("/sessions/create", {"tool_parser": "hermes"}),
                (f"/s/{sid}/v1/chat/completions", CHAT),
                (f"/s/{sid}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 8}),
                (f"/s/{sid}/v1/messages", CHAT),
                (f"/s/{sid}/v1/responses", {"model": "m", "input": "hi"}),
                (f"/sessions/{sid}/reward", {"reward": 1.0}),
                (f"/{uuid}/v1/chat/completions", CHAT),
            ],
            "gets": ["/sessions", f"/sessions/{sid}/trajectory", f"/{uuid}/nodes"],
            "deletes": [f"/sessions/{sid}", f"/{uuid}"],
            "json": [("/sessions", {}), (f"/{uuid}/v1/chat/completions", CHAT)],
        }
        page_text = attack_page(url, plan, ATTACK)
        (folder / "index.html").write_text(page_text)
        fake.reset_counters()
        app.clear()
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{origin}/index.html")
            page.wait_for_function("window.__results !== undefined", timeout=20_000)
            results = page.evaluate("window.__results")
        finally:
            context.close()
        time.sleep(0.5)  # a beacon may land after the page is gone

        # the attacks reached the proxy (so its refusals, not the browser, stopped them)
        posted = {p for m, p in app.seen if m == "POST"}
        wanted = {path for path, _ in plan["posts"]}
        assert wanted <= posted, (sorted(wanted - posted), results)
        assert {("GET", path) for path in plan["gets"]} <= set(app.seen), app.seen
        # the preflighted requests: each preflight came, was not granted, and nothing followed
        for path in [*plan["deletes"], *(p for p, _ in plan["json"])]:
            assert ("OPTIONS", path) in app.seen, app.seen
        for name, answer in results.items():
            if name.startswith("cors"):
                assert str(answer).startswith("rejected"), (name, answer)
        assert not [p for m, p in app.seen if m == "DELETE"]
        sent_json = [
            (m, p)
            for m, p, h in app.heads
            if m == "POST" and h.get("content-type", "").startswith("application/json")
        ]
        assert sent_json == [], sent_json
        # every request came from the page (another port of 127.0.0.1: the same site) and was
        # refused with a 4xx (the page cannot read no-cors answers; the proxy's are here)
        assert {h.get("sec-fetch-site") for _, _, h in app.heads} == {"same-site"}
        assert all(400 <= status < 500 for _, _, status in app.answers), app.answers

        # nothing changed: the test's two sessions only, as they were; nothing generated
        assert state(proxy) == before
        assert sum(fake.requests[path] for path in GENERATION) == 0, fake.requests
