"""A real Chromium opens an attacker's page on another loopback port; the page throws every
simple cross-site write it can at the API (a `no-cors` text/plain fetch, a form POST, an
`<img>` on `/reset_data`, a beacon, a `no-cors` fetch to `/register`). The API sees every
request arrive and writes or wipes nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import group_json, registration_json

ENV = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2}

ATTACK = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="wipe" method="POST" action="API/reset_data" target="sink"></form>
<form id="poison" method="POST" action="API/scored_data" enctype="text/plain" target="sink">
  <input name='{"tokens":[[6]],"masks":[[6]],"scores":[1],"x":"' value='"}'>
</form>
<script>
const api = "API";
const group = JSON.stringify(GROUP);
const waits = [];
const send = (path, init) => waits.push(fetch(api + path, init).then(() => 0, () => 0));
send("/scored_data", {method: "POST", mode: "no-cors",
                      headers: {"Content-Type": "text/plain"}, body: group});
send("/scored_data", {method: "POST", mode: "no-cors", body: new Blob([group])});
send("/register", {method: "POST", mode: "no-cors",
                   headers: {"Content-Type": "text/plain"}, body: JSON.stringify(REGISTER)});
send("/register", {method: "POST", headers: {"Content-Type": "application/json"},
                   body: JSON.stringify(REGISTER)});
send("/batch", {mode: "no-cors"});
navigator.sendBeacon(api + "/scored_data", new Blob([group], {type: "text/plain"}));
waits.push(new Promise(done => {
  const img = new Image();
  img.onload = img.onerror = done;
  img.src = api + "/reset_data";
}));
document.getElementById("poison").submit();
setTimeout(() => document.getElementById("wipe").submit(), 100);
Promise.all(waits).then(() => setTimeout(() => { window.__done = true; }, 500));
</script></body></html>"""


def snapshot(c: httpx.Client) -> dict[str, Any]:
    stats = c.get("/stats").json()
    return {
        "info": c.get("/info").json(),
        "status": c.get("/status").json(),
        "latest": c.get("/latest_example").json(),
        "groups_in": {k: v["groups_in"] for k, v in stats["envs"].items()},
        "registered": stats["registered"],
        "internal_errors": stats["internal_errors"],
    }


def test_an_attackers_page_in_chromium_writes_and_wipes_nothing(attacker_site, browser, recorder):
    """`attacker_site`, `browser`, `recorder`: tests/conftest.py."""
    folder, origin = attacker_site
    app = recorder(create_app(ApiConfig()))
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as api:
        assert api.post("/register", json=registration_json(4)).status_code == 200
        api.get("/batch")
        api.post("/register-env", json=ENV)
        api.post("/scored_data", json=group_json(2, tag=1, env_id=0))
        before = snapshot(api)
        page_text = (
            ATTACK.replace("API", url)
            .replace("GROUP", json.dumps(group_json(2, tag=6, env_id=0)))
            .replace("REGISTER", json.dumps(registration_json(2)))
        )
        (folder / "index.html").write_text(page_text)
        app.seen.clear()
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{origin}/index.html")
            page.wait_for_function("window.__done === true", timeout=10_000)
        finally:
            context.close()
        arrived = {(m, p) for m, p in app.seen}
        # the attacks reached the API (so the refusals, not the browser, stopped them)
        assert ("POST", "/scored_data") in arrived and ("GET", "/reset_data") in arrived
        assert ("POST", "/reset_data") in arrived and ("POST", "/register") in arrived
        assert snapshot(api) == before
