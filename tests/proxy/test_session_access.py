"""A session id alone is not a credential: an attacker on the same machine who knows another
session's public id (from a trajectory, a log line, a `/s/{id}/` URL) and holds no key, or only
the key of a session of its own, can neither list, read, extend nor delete that session, on our
routes or on upstream's; upstream's client, which sends no key, still works by its `uuid`."""

from __future__ import annotations

import contextlib
import json
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
BODIES: dict[str, Any] = {
    "chat/completions": CHAT,
    "completions": {"model": "m", "prompt": "hi", "max_tokens": 8},
    "responses": {"model": "m", "input": "hi"},
    "messages": CHAT,
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=lambda prompt: "hello") as server:
        yield server


@contextlib.contextmanager
def running(proxy: Proxy) -> Iterator[str]:
    with serve_in_thread(build_app(proxy)) as url:
        yield url


def victims(url: str, proxy: Proxy) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session made by our route and one made by upstream's, one call each."""
    ours = httpx.post(f"{url}/sessions").json()
    client = openai.OpenAI(base_url=ours["base_url"], api_key=ours["api_key"], max_retries=0)
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
    theirs = httpx.post(f"{url}/sessions/create", json={"tool_parser": "hermes"}).json()
    client = openai.OpenAI(base_url=f"{url}/{theirs['uuid']}/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
    [theirs["id"]] = [sid for sid in proxy.sessions if sid != ours["id"]]
    return ours, theirs


def attack(url: str, sid: str, headers: dict[str, str]) -> dict[str, int]:
    """Every route that could reach session `sid`, with `headers`: what each answered."""
    c = httpx.Client(base_url=url, headers=headers)
    answers = {
        "upstream chat": c.post(f"/{sid}/v1/chat/completions", json=CHAT),
        "upstream render": c.post(f"/{sid}/v1/chat/completions/render", json=CHAT),
        "upstream nodes": c.get(f"/{sid}/nodes"),
        "upstream delete": c.delete(f"/{sid}"),
        "trajectory": c.get(f"/sessions/{sid}/trajectory"),
        "reward": c.post(f"/sessions/{sid}/reward", json={"reward": 1.0}),
        "delete": c.delete(f"/sessions/{sid}"),
        "models": c.get(f"/s/{sid}/v1/models"),
        "by header": c.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": sid}),
        "id as key": c.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": sid}),
    }
    for name, body in BODIES.items():
        answers[name] = c.post(f"/s/{sid}/v1/{name}", json=body)
    return {name: answer.status_code for name, answer in answers.items()}


def state(proxy: Proxy, sid: str) -> tuple[int, Any, list[Any], bool]:
    session = proxy.sessions[sid]
    doc = session.trajectory().to_dict()
    return session.turns, session.reward, doc["sequences"], session.finished


@pytest.mark.parametrize("own_key", [False, True])
def test_another_sessions_public_id_reaches_nothing(fake, own_key):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        ours, theirs = victims(url, proxy)
        before = {sid: state(proxy, sid) for sid in (ours["id"], theirs["id"])}
        headers = {}
        if own_key:  # the attacker's own session: its key opens no one else's
            key = httpx.post(f"{url}/sessions").json()["api_key"]
            headers = {"authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/sessions", headers=headers).status_code == 401
        for sid in before:
            answers = attack(url, sid, headers)
            if own_key:  # these reach the attacker's own session, by its key (checked below)
                assert answers.pop("by header") == answers.pop("id as key") == 200
            assert set(answers.values()) <= {401, 404}, answers
            assert answers["upstream nodes"] == answers["upstream delete"] == 404
        assert {sid: state(proxy, sid) for sid in before} == before


def test_listing_needs_the_proxy_key(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = httpx.post(f"{url}/sessions").json()
        for headers in ({}, {"authorization": f"Bearer {session['api_key']}"}):
            answer = httpx.get(f"{url}/sessions", headers=headers)
            assert answer.status_code == 401 and "--api-key" in answer.json()["error"]["message"]
    proxy = make_proxy(fake.base_url, api_key="admin-key")
    with running(proxy) as url:
        admin = {"authorization": "Bearer admin-key"}
        session = httpx.post(f"{url}/sessions", headers=admin).json()
        mine = {"authorization": f"Bearer {session['api_key']}"}
        assert httpx.get(f"{url}/sessions", headers=mine).status_code == 401
        assert len(httpx.get(f"{url}/sessions", headers=admin).json()["sessions"]) == 1


def test_upstreams_uuid_is_a_secret_apart_from_the_id(fake, caplog):
    """The uuid is not the id nor the key, and no trajectory, listing or error message shows it;
    upstream's keyless flow works by it, and it dies with its session."""
    proxy = make_proxy(fake.base_url, api_key="admin-key")
    admin = {"authorization": "Bearer admin-key"}
    with running(proxy) as url:
        created = httpx.post(f"{url}/sessions/create", headers=admin).json()
        cap = created["uuid"]
        [session] = proxy.sessions.values()
        assert len(cap) >= 43 and cap not in (session.id, session.key)
        assert cap not in json.dumps(session.trajectory().to_dict())
        assert cap not in json.dumps([str(v) for v in vars(session).values()])
        assert cap not in httpx.get(f"{url}/sessions", headers=admin).text
        # with a proxy key, the uuid alone is not enough either (as before)
        assert httpx.get(f"{url}/{cap}/nodes").status_code == 401
        missing = httpx.get(f"{url}/{cap}/elsewhere", headers=admin)
        assert missing.status_code == 404 and cap not in missing.text
        assert httpx.get(f"{url}/{cap}/nodes", headers=admin).json() == {"nodes": []}
        assert httpx.delete(f"{url}/{cap}", headers=admin).status_code == 200
        gone = httpx.get(f"{url}/{cap}/nodes", headers=admin)
        assert gone.status_code == 404 and cap not in gone.text
    assert cap not in caplog.text


def test_upstreams_keyless_client_flow(fake):
    """As atroposlib's ProxyManagedServer does it: create, chat through an OpenAI client with
    any key at `{proxy}/{uuid}/v1`, read the nodes and delete, with no key of its own."""
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        created = httpx.post(f"{url}/sessions/create", json={"tool_parser": "hermes"}).json()
        base = f"{url}/{created['uuid']}"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
        [session] = proxy.sessions.values()
        assert session.turns == 2
        assert len(httpx.get(f"{base}/nodes").json()["nodes"]) == 2  # two separate chats
        assert httpx.delete(base).json() == {"status": "deleted", "uuid": created["uuid"]}
        assert not proxy.sessions
        assert httpx.get(f"{base}/nodes").status_code == 404
