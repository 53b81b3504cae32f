"""An env's own drop and failure counts, sent with `/status-env`, shown in `/stats` and
`/metrics` beside the API's drops; old bodies unchanged; bad counts refused naming the field."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from atropos.api.openapi import openapi_document

from .conftest import Clock, env_request, registration

ENV = {"max_token_length": 2048, "desired_name": "env", "weight": 1.0, "group_size": 2}
STATUS_KEYS = {
    "current_step",
    "queue_size",
    "unallocated_fraction",
    "self_queue_size",
    "max_group_size",
    "env_weight",
}


def env(client: httpx.Client, name: str = "env") -> int:
    env_id: int = client.post("/register-env", json={**ENV, "desired_name": name}).json()["env_id"]
    return env_id


def test_reports_by_get_body_and_post_show_in_stats_beside_the_api_drops(client):
    a, b = env(client, "serve"), env(client, "other")
    report = {"env_id": a, "dropped": {"identical_scores": 17209}, "failed": {"timeout": 2}}
    got = client.request("GET", "/status-env", content=json.dumps(report))
    assert got.status_code == 200 and set(got.json()) == STATUS_KEYS  # the answer is upstream's
    stats = client.get("/stats").json()
    mine = stats["envs"][str(a)]
    assert mine["env_dropped"] == {"identical_scores": 17209}
    assert mine["env_failed"] == {"timeout": 2}
    assert isinstance(mine["env_reported_at"], float)
    assert mine["drops"] == {}  # the API's own drops stay apart
    assert stats["envs"][str(b)]["env_dropped"] == {}
    assert stats["envs"][str(b)]["env_reported_at"] is None

    # cumulative counts: the latest report replaces the last, it is never added to it
    later = {"env_id": a, "dropped": {"identical_scores": 17300, "too_long": 1}}
    assert client.post("/status-env", json=later).status_code == 200
    client.post("/status-env", json={"env_id": b, "dropped": {"identical_scores": 5}})
    stats = client.get("/stats").json()
    assert stats["envs"][str(a)]["env_dropped"] == {"identical_scores": 17300, "too_long": 1}
    assert stats["envs"][str(a)]["env_failed"] == {"timeout": 2}  # left out: kept
    assert stats["env_dropped"] == {"identical_scores": 17305, "too_long": 1}
    assert stats["env_failed"] == {"timeout": 2}
    assert stats["drops"] == {}


def test_an_old_body_and_a_query_change_nothing_and_answer_as_before(client):
    a = env(client)
    before = client.get("/stats").json()
    plain = client.request("GET", "/status-env", content=json.dumps({"env_id": a}))
    by_query = client.get("/status-env", params={"env_id": a})
    by_post = client.post("/status-env", json={"env_id": a})
    assert plain.json() == by_query.json() == by_post.json()
    assert set(plain.json()) == STATUS_KEYS
    after = client.get("/stats").json()
    assert after["envs"][str(a)]["env_reported_at"] is None
    assert after["env_dropped"] == {} and after["env_failed"] == {}
    # every field /stats had before is still there, with the same value
    for key in ("step", "queued_groups", "queued_sequences", "leased_batches", "drops"):
        assert after[key] == before[key]
    # a report may come with the query form too, as long as the ids agree
    both = client.post("/status-env", params={"env_id": a}, json={"env_id": a, "failed": {"X": 1}})
    assert both.status_code == 200
    assert client.get("/stats").json()["envs"][str(a)]["env_failed"] == {"X": 1}
    other = client.post("/status-env", params={"env_id": a}, json={"env_id": a + 1})
    assert other.status_code == 422 and "query says" in other.json()["detail"]


def test_msgpack_reports_are_read_too(client):
    a = env(client)
    raw = msgspec.msgpack.encode({"env_id": a, "dropped": {"all_wrong": 3}})
    got = client.post("/status-env", content=raw, headers={"content-type": "application/msgpack"})
    assert got.status_code == 200
    assert client.get("/stats").json()["envs"][str(a)]["env_dropped"] == {"all_wrong": 3}


@pytest.mark.parametrize(
    ("part", "bad", "rule"),
    [
        ("dropped", {"x": -1}, ">= 0"),
        ("dropped", {"x": 2**53}, "<= 9007199254740991"),
        ("dropped", {"x": 1.5}, "Expected `int`"),
        ("dropped", {"x": "many"}, "Expected `int`"),
        ("dropped", {"x": True}, "Expected `int`"),
        ("dropped", {"r" * 101: 1}, "length <= 100"),
        ("failed", {"": 1}, "length >= 1"),
        ("failed", {f"k{i}": 1 for i in range(65)}, "length <= 64"),
        ("failed", [1, 2], "Expected `object | null`"),
        ("failed", 7, "Expected `object | null`"),
    ],
)
def test_bad_counts_are_refused_naming_the_field_and_the_rule(client, part, bad, rule):
    a = env(client)
    client.post("/status-env", json={"env_id": a, "dropped": {"kept": 1}})
    got = client.post("/status-env", json={"env_id": a, part: bad})
    assert got.status_code == 422, got.text
    detail = got.json()["detail"]
    assert f"$.{part}" in detail and rule in detail, detail
    assert "at most 64 names of 1 to 100 characters" in detail  # how to fix it
    # a refused report changes nothing
    assert client.get("/stats").json()["envs"][str(a)]["env_dropped"] == {"kept": 1}


def test_unknown_envs_and_bad_json_are_refused_without_a_server_error(client):
    env(client)
    unknown = client.post("/status-env", json={"env_id": 9, "dropped": {"x": 1}})
    assert unknown.status_code == 404
    assert client.get("/stats").json()["env_dropped"] == {}
    broken = client.request("GET", "/status-env", content=b'{"env_id": 0, "dropped": {x}}')
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["detail"]


def test_reports_outlive_disconnects_and_restarts_for_the_run_until_reset(client):
    a = env(client)
    client.post("/status-env", json={"env_id": a, "dropped": {"x": 4}, "failed": {"t": 1}})
    client.post("/disconnect-env", json={"env_id": a})
    stats = client.get("/stats").json()  # the dashboard still shows why the groups went
    gone = stats["envs"][str(a)]
    assert gone["env_dropped"] == {"x": 4} and not gone["connected"]
    assert stats["env_dropped"] == {"x": 4} and stats["env_failed"] == {"t": 1}
    client.post("/status-env", json={"env_id": a, "dropped": {"x": 5}})
    assert client.get("/stats").json()["env_dropped"] == {"x": 9}
    client.post("/register-env", json={**ENV, "env_key": "k"})  # a new process: from zero
    b = client.post("/register-env", json={**ENV, "env_key": "k"}).json()["env_id"]
    client.post("/status-env", json={"env_id": b, "dropped": {"y": 3}})
    client.post("/register-env", json={**ENV, "env_key": "k"})
    client.post("/status-env", json={"env_id": b, "dropped": {"y": 1}})
    assert client.get("/stats").json()["envs"][str(b)]["env_dropped"] == {"y": 4}
    client.post("/status-env", json={"env_id": b, "dropped": {"y": 2}})  # the same process
    assert client.get("/stats").json()["envs"][str(b)]["env_dropped"] == {"y": 5}
    client.post("/status-env", json={"env_id": b, "dropped": {"y": 1}})  # restarted, unseen
    assert client.get("/stats").json()["envs"][str(b)]["env_dropped"] == {"y": 6}
    client.post("/reset_data")
    assert client.get("/stats").json()["env_dropped"] == {}


def test_metrics_carry_the_reports_with_escaped_labels(client):
    a = env(client)
    odd = 'say "hi"\\now\nthen'
    client.post("/status-env", json={"env_id": a, "dropped": {"too_easy": 7, odd: 1}})
    client.post("/status-env", json={"env_id": a, "failed": {"TimeoutError": 2}})
    text = client.get("/metrics").text
    assert f'atropos_env_reported_dropped_total{{env="{a}",reason="too_easy"}} 7' in text
    escaped = 'reason="say \\"hi\\"\\\\now\\nthen"'
    assert f'atropos_env_reported_dropped_total{{env="{a}",{escaped}}} 1' in text
    assert f'atropos_env_reported_failed_total{{env="{a}",kind="TimeoutError"}} 2' in text
    assert f'atropos_env_report_timestamp_seconds{{env="{a}"}} ' in text
    assert "# TYPE atropos_env_reported_dropped_total counter" in text
    for line in text.splitlines():  # every sample is one line: no raw newline got through
        assert line.startswith("#") or line.startswith("atropos_"), line


def test_the_openapi_document_describes_the_report():
    doc = openapi_document()
    post = doc["paths"]["/status-env"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert schema["required"] == ["env_id"]
    dropped = schema["properties"]["dropped"]["anyOf"][0]
    assert dropped["maxProperties"] == 64
    assert dropped["propertyNames"] == {"minLength": 1, "maxLength": 100}
    assert dropped["additionalProperties"]["minimum"] == 0
    assert "get" in doc["paths"]["/status-env"]  # the upstream form stays


def test_waiting_and_leased_groups_split_what_is_queued():
    from atropos.api.hub import Hub
    from atropos.api.stats import stats
    from atropos.api.store import MemoryStore

    from .conftest import make_group

    hub = Hub(MemoryStore(), clock=Clock())
    hub.register(registration(batch_size=2))
    hub.next_batch(None)
    a = hub.register_env(env_request())["env_id"]
    hub.ingest([make_group(2, env_id=a, tag=t) for t in range(3)])
    hub.next_batch(lease=60.0)  # one group leased, not yet acknowledged
    doc = stats(hub)
    mine = doc["envs"][str(a)]
    assert (mine["groups_in"], mine["groups_out"], mine["queued_groups"]) == (3, 1, 3)
    assert (mine["waiting_groups"], mine["leased_groups"]) == (2, 1)
    assert (doc["waiting_groups"], doc["leased_groups"], doc["leased_batches"]) == (2, 1, 1)
