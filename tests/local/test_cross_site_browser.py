"""A real Chromium opens an attacker's page on another loopback port; the page throws every
simple cross-site request it can at `atropos local serve` as a default user runs it (loopback,
no API key): a pause in mode abort, a resume, completions (a `no-cors` text/plain fetch, a
bodiless Blob, a text/plain form, a beacon), a reload of other weights at policy version 999,
a weight-transfer rendezvous at a port the test listens on, a LoRA adapter load, and a `cors`
fetch with `Content-Type: application/json` (which needs a preflight). The server sees the
requests arrive and changes nothing: the same version and weights, not paused, no adapter, no
rendezvous joined, and the preflighted request never sent. (A DNS-rebound page needs a
resolver Chromium does not let a test supply: tests/test_http_rules.py covers the Host rule.)
"""

from __future__ import annotations

import select
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atropos.local.engine import Engine
from atropos.local.lora import save_adapter
from atropos.local.server import LocalServer
from atropos.testing import serve_in_thread

MODEL = "tiny"
ATTACK = """for (const [path, doc] of plan) {
  const body = JSON.stringify(doc);
  text(path, body);
  blob(path, body);
  form(path, doc);
}
for (const path of ["/v1/chat/completions", "/v1/completions"]) {
  const [, doc] = plan.find(([p]) => p === path);
  results["beacon " + path] = navigator.sendBeacon(
    api + path, new Blob([JSON.stringify(doc)], {type: "text/plain"}));
}
for (const path of ["/v1/load_lora_adapter", "/update_weights_from_disk"]) {
  const [, doc] = plan.find(([p]) => p === path);
  settle("cors json " + path, fetch(api + path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(doc)}));
}
Promise.all(waits).then(() => setTimeout(() => { window.__results = results; }, 500));
</script></body></html>"""


def adapter(model_dir: Path, where: Path) -> Path:
    """A valid LoRA adapter for the served model (rank 2 on one q_proj): the page's payload is
    a real one, so only the refusal stops it."""
    from atropos.local.weights import load_fp32

    module = "model.layers.0.self_attn.q_proj"
    rows, cols = load_fp32(str(model_dir)).get_submodule(module).weight.shape
    g = torch.Generator().manual_seed(0)
    pair = (torch.randn(2, cols, generator=g), torch.randn(rows, 2, generator=g))
    save_adapter(where, {module: pair}, r=2, alpha=4, target_modules=["q_proj"])
    return where


@pytest.fixture
def rendezvous() -> Iterator[socket.socket]:
    """A listening socket on loopback: the trainer's rendezvous the page points the server at
    (had the server joined it, this socket would see the connection)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def joined(sock: socket.socket) -> bool:
    """Whether anyone connected to the rendezvous socket."""
    return bool(select.select([sock], [], [], 0)[0])


def snapshot(c: httpx.Client) -> dict[str, Any]:
    return {
        "health": c.get("/health").json(),
        "paused": c.get("/is_paused").json(),
        "models": sorted(m["id"] for m in c.get("/v1/models").json()["data"]),
        "weights": c.get("/weights_checksum").json(),
    }


def test_an_attackers_page_in_chromium_changes_nothing_on_local_serve(
    attacker_site,
    attack_page,
    browser,
    recorder,
    model_dir,
    other_model_dir,
    tmp_path_factory,
    rendezvous,
):
    """`attacker_site`, `attack_page`, `browser`, `recorder`: tests/conftest.py."""
    folder, origin = attacker_site
    lora_dir = adapter(model_dir, tmp_path_factory.mktemp("lora") / "evil")
    reload_dir = tmp_path_factory.mktemp("ckpt") / "other"
    shutil.copytree(other_model_dir, reload_dir)
    port = rendezvous.getsockname()[1]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    plan: list[tuple[str, dict[str, Any]]] = [
        ("/pause?mode=abort", {}),
        ("/resume", {}),
        ("/v1/chat/completions", chat),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}),
        ("/update_weights_from_disk", {"model_path": str(reload_dir), "policy_version": 999}),
        (
            "/init_weight_transfer_engine",
            {
                "init_info": {
                    "master_address": "127.0.0.1",
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": 2,
                }
            },
        ),
        ("/v1/load_lora_adapter", {"lora_name": "evil", "lora_path": str(lora_dir)}),
    ]
    engine = Engine(str(model_dir), device="cpu", seed=0).start()
    try:
        app = recorder(LocalServer(engine, served_model_name=MODEL).app)  # as a default user
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
            before = snapshot(c)
            assert before["paused"] == {"is_paused": False} and before["models"] == [MODEL]
            page_text = attack_page(url, plan, ATTACK)
            (folder / "index.html").write_text(page_text)
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

            # the attacks reached the server (so its refusals, not the browser, stopped them)
            posted = {path for method, path in app.seen if method == "POST"}
            paths = {path.partition("?")[0] for path, _ in plan}
            assert paths <= posted, (sorted(paths - posted), results)
            # the preflighted requests: the preflight came, was not granted, and nothing followed
            for path in ("/v1/load_lora_adapter", "/update_weights_from_disk"):
                assert ("OPTIONS", path) in app.seen
                assert str(results[f"cors json {path}"]).startswith("rejected"), results
            sent_json = [
                (m, p)
                for m, p, h in app.heads
                if m == "POST" and h.get("content-type", "").startswith("application/json")
            ]
            assert sent_json == [], sent_json
            # every request came from the page (another port of 127.0.0.1: the same site) and
            # was refused with a 4xx (the page cannot read no-cors answers; the server's are here)
            assert {h.get("sec-fetch-site") for _, _, h in app.heads} == {"same-site"}
            assert all(400 <= status < 500 for _, _, status in app.answers), app.answers

            # nothing changed: same version and weights, not paused, no adapter, no rendezvous
            assert snapshot(c) == before
            assert not joined(rendezvous), "the server joined the page's rendezvous"
            started = time.monotonic()
            done = c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4})
            assert done.status_code == 200, done.text
            assert time.monotonic() - started < 10

            # the payloads were real: the same bodies from a Python client do what they say
            load = c.post("/v1/load_lora_adapter", json=dict(plan)["/v1/load_lora_adapter"])
            assert load.status_code == 200, load.text
            assert "evil" in {m["id"] for m in c.get("/v1/models").json()["data"]}
            reload = c.post(
                "/update_weights_from_disk", json=dict(plan)["/update_weights_from_disk"]
            )
            assert reload.status_code == 200, reload.text
            assert c.get("/health").json()["policy_version"] == 999
    finally:
        engine.close()
