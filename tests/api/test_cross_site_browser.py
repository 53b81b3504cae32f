"""A real Chromium opens an attacker's page on another loopback port; the page throws every
simple cross-site write it can at the API (a `no-cors` text/plain fetch, a form POST, an
`<img>` on `/reset_data`, a beacon, a `no-cors` fetch to `/register`). The API sees every
request arrive and writes or wipes nothing."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import free_port, serve_in_thread

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


def chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if found is None:
        pytest.fail("chromium is not installed: run `make chromium` (Debian's package)")
    return found


class Recorder:
    """An ASGI wrapper that notes every HTTP request reaching the API (method, path)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@pytest.fixture
def attacker_site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A static web server on another loopback port: the attacker's origin."""
    port = free_port()
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, name="attacker", daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


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


def test_an_attackers_page_in_chromium_writes_and_wipes_nothing(attacker_site):
    from playwright.sync_api import sync_playwright

    folder, origin = attacker_site
    app = Recorder(create_app(ApiConfig()))
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
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium(),
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            try:
                page = browser.new_page()
                page.goto(f"{origin}/index.html")
                page.wait_for_function("window.__done === true", timeout=10_000)
            finally:
                browser.close()
        arrived = {(m, p) for m, p in app.seen}
        # the attacks reached the API (so the refusals, not the browser, stopped them)
        assert ("POST", "/scored_data") in arrived and ("GET", "/reset_data") in arrived
        assert ("POST", "/reset_data") in arrived and ("POST", "/register") in arrived
        assert snapshot(api) == before
