"""Browsers' cross-site requests and foreign Host names are refused on every endpoint that
changes state, with nothing written or wiped; Python clients (no Origin, no Sec-Fetch-*,
`application/json`) keep working unchanged, `GET /reset_data` included."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.http.origin import Site
from atropos.testing import serve_in_thread

from .conftest import group_json, registration_json

ENV = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2}

# (method, path, JSON body or None): every request that changes state
WRITES: list[tuple[str, str, Any]] = [
    ("POST", "/register", registration_json(4)),
    ("POST", "/register-env", ENV),
    ("POST", "/disconnect-env", {"env_id": 0}),
    ("GET", "/batch", None),
    ("GET", "/batch?lease=30", None),
    ("POST", "/batch/ack", {"batch_id": "0" * 32}),
    ("POST", "/scored_data", group_json(2, tag=7, env_id=0)),
    ("POST", "/scored_data_list", [group_json(2, tag=7, env_id=0)]),
    ("POST", "/status-env", {"env_id": 0, "dropped": {"x": 1}}),
    ("GET", "/reset_data", None),
    ("POST", "/reset_data", None),
]

HOSTILE: list[tuple[str, dict[str, str]]] = [
    ("fetch-cross-site", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}),
    ("fetch-same-site", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}),
    ("img-cross-site", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "image"}),
    ("origin-other-port", {"Origin": "http://127.0.0.1:9"}),
    ("origin-other-site", {"Origin": "https://attacker.example"}),
    ("origin-null", {"Origin": "null"}),
    ("origin-and-fetch", {"Origin": "http://localhost:9", "Sec-Fetch-Site": "same-site"}),
    ("host-rebound", {"Host": "attacker.example:8000"}),
    ("host-rebound-same-origin", {"Host": "rebind.example", "Origin": "http://rebind.example"}),
]


@pytest.fixture
def api() -> Iterator[httpx.Client]:
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as c:
        assert c.post("/register", json=registration_json(4)).status_code == 200
        c.get("/batch")
        assert c.post("/register-env", json=ENV).json()["env_id"] == 0
        assert c.post("/scored_data", json=group_json(2, tag=1, env_id=0)).status_code == 200
        yield c


def state(c: httpx.Client) -> dict[str, Any]:
    """Everything a hostile write could change: registration, step, queue, counters, envs."""
    stats = c.get("/stats").json()
    for env in stats["envs"].values():
        env.pop("live", None)
    return {
        "info": c.get("/info").json(),
        "wandb": c.get("/wandb_info").json(),
        "status": c.get("/status").json(),
        "latest": c.get("/latest_example").json(),
        "stats": {k: v for k, v in stats.items() if k != "batch_latency_seconds"},
    }


def send(c: httpx.Client, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    if body is None:
        return c.request(method, path, headers=headers)
    return c.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("name", "headers"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_browser_headers_are_refused_on_every_write(api, name, headers):
    before = state(api)
    for method, path, body in WRITES:
        reply = send(api, method, path, body, headers)
        assert reply.status_code == 403, (name, method, path, reply.text)
        detail = reply.json()["detail"]
        assert ("--allowed-host" in detail) if "Host" in headers else ("refused" in detail)
    assert state(api) == before


@pytest.mark.parametrize(
    "ctype",
    ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"],
)
def test_a_simple_request_content_type_is_refused(api, ctype):
    """What a form or a `no-cors` fetch can send, even with no Origin or Fetch Metadata (an
    old browser): refused with 415 naming the type to send."""
    before = state(api)
    for method, path, body in WRITES:
        if method != "POST":
            continue
        content = b"" if body is None else httpx.Request("POST", "/", json=body).content
        reply = api.post(path, content=content, headers={"Content-Type": ctype})
        assert reply.status_code == 415, (path, reply.text)
        assert "application/json" in reply.json()["detail"]
    assert state(api) == before


def test_reads_with_a_foreign_host_are_refused(api):
    """DNS rebinding reads data with the attacker's name in Host: refused, pages included."""
    for path in ("/stats", "/rollouts", "/latest_example", "/info", "/metrics", "/dashboard"):
        reply = api.get(path, headers={"Host": "attacker.example"})
        assert reply.status_code == 403 and "--allowed-host" in reply.json()["detail"]


def test_python_clients_pass_unchanged(api):
    """What requests/aiohttp send (no Origin, no Sec-Fetch-*, Host 127.0.0.1 or localhost,
    application/json or nothing) works on every write, GET /reset_data included."""
    port = api.base_url.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", None):
        headers = {"Host": host} if host else {}
        for method, path, body in WRITES:
            if path == "/batch/ack":
                continue  # needs a real lease
            reply = send(api, method, path, body, headers)
            assert reply.status_code < 400 or reply.status_code == 404, (path, reply.text)
        assert api.get("/reset_data", headers=headers).text == "Reset successful"
        api.post("/register", json=registration_json(4), headers=headers)
        api.get("/batch", headers=headers)
        api.post("/register-env", json=ENV, headers=headers)
    gz = api.post("/scored_data", content=b'{"tokens":[[1]],"masks":[[1]],"scores":[0]}')
    assert gz.status_code == 200  # no Content-Type at all: accepted


def test_same_origin_pages_and_listed_origins_pass():
    listed = "https://board.example"
    config = ApiConfig(cors_origins=[listed])
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        own = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
        assert c.post("/register", json=registration_json(4), headers=own).status_code == 200
        cors = {"Origin": listed, "Sec-Fetch-Site": "cross-site"}
        reply = c.get("/stats", headers=cors)
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == listed
        typed = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}
        assert c.get("/reset_data", headers=typed).status_code == 200  # the address bar
        link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        assert c.get("/dashboard", headers=link).status_code == 200  # a link to the page
        assert c.get("/stats", headers=link).status_code == 403  # but not to data


def test_allowed_host_names_and_non_loopback_rules():
    config = ApiConfig(allowed_hosts=["trainer.lan"])
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        assert c.get("/status", headers={"Host": "trainer.lan:8000"}).status_code == 200
        assert c.get("/status", headers={"Host": "other.lan:8000"}).status_code == 403
        assert c.get("/status", headers={"Host": "10.0.0.5:8000"}).status_code == 403
    loopback = Site.of("127.0.0.1")
    assert loopback.accepts_host("127.0.0.2:8000") and loopback.accepts_host("LOCALHOST.")
    wide = Site.of("0.0.0.0")
    assert wide.accepts_host("10.0.0.5:8000") and not wide.accepts_host("attacker.example")
    assert Site.of("0.0.0.0", api_key=True).accepts_host("attacker.example")
    assert not Site.of("127.0.0.1", api_key=True).accepts_host("attacker.example")
    assert Site.of("127.0.0.1", ["*"]).accepts_host("anything.example")
