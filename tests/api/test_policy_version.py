"""`POST /policy_version`: the trainer says which weights the servers serve.

The API's step counts batches handed out, and a batch is handed out before the weights trained
on it reach the servers; environments stamp groups with the published version instead, so a
group never claims newer weights than generated it (docs/api.md, "Policy versions").
"""

from __future__ import annotations

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import registration_json

ENV = {"max_token_length": 2048, "desired_name": "env", "weight": 1.0, "group_size": 2}


def start(c: httpx.Client) -> int:
    c.post("/register", json=registration_json(4)).raise_for_status()
    c.get("/batch").raise_for_status()
    return int(c.post("/register-env", json=ENV).json()["env_id"])


def test_status_says_the_published_version_once_a_trainer_said_one():
    with serve_in_thread(create_app()) as url, httpx.Client(base_url=url) as c:
        env_id = start(c)
        assert c.get("/status").json() == {"current_step": 0, "queue_size": 0}  # upstream's
        assert "policy_version" not in c.get(f"/status-env?env_id={env_id}").json()
        reply = c.post("/policy_version", json={"version": 3})
        assert reply.status_code == 200 and reply.json()["policy_version"] == 3
        assert c.get("/status").json() == {"current_step": 0, "queue_size": 0, "policy_version": 3}
        assert c.get(f"/status-env?env_id={env_id}").json()["policy_version"] == 3
        assert c.post("/register-env", json=ENV).json()["policy_version"] == 3
        c.post("/policy_version", json={"version": 1})  # a trainer resumed from a checkpoint
        assert c.get("/status").json()["policy_version"] == 1


@pytest.mark.parametrize(
    "raw",
    [b'{"version": -1}', b'{"version": "x"}', b"{}", b'{"version": 1e400}', b"[3]"],
)
def test_a_bad_version_is_a_4xx_naming_the_field_and_changes_nothing(raw):
    with serve_in_thread(create_app()) as url, httpx.Client(base_url=url) as c:
        start(c)
        c.post("/policy_version", json={"version": 2})
        reply = c.post("/policy_version", content=raw, headers={"content-type": "application/json"})
        assert 400 <= reply.status_code < 500
        assert "version" in reply.text or "object" in reply.text, reply.text
        assert c.get("/status").json()["policy_version"] == 2


def test_the_route_takes_the_api_key():
    app = create_app(ApiConfig(api_key="k"))
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as c:
        assert c.post("/policy_version", json={"version": 1}).status_code == 401
        ok = c.post("/policy_version", json={"version": 1}, headers={"authorization": "Bearer k"})
        assert ok.status_code == 200


def test_the_version_survives_a_restart_and_reset_forgets_it(tmp_path):
    store = f"sqlite:{tmp_path / 'api.db'}"
    with (
        serve_in_thread(create_app(ApiConfig(store=store))) as url,
        httpx.Client(base_url=url) as c,
    ):
        start(c)
        c.post("/policy_version", json={"version": 5})
    with (
        serve_in_thread(create_app(ApiConfig(store=store))) as url,
        httpx.Client(base_url=url) as c,
    ):
        assert c.get("/status").json()["policy_version"] == 5
        c.post("/reset_data")
        assert "policy_version" not in c.get("/status").json()
