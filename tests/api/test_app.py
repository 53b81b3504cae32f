"""The API over real HTTP (uvicorn on loopback): shapes, bad input, compression, auth, CORS."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import group_json, registration_json

ENV = {"max_token_length": 2048, "desired_name": "env", "weight": 1.0, "group_size": 2}


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    config = ApiConfig(max_body_bytes=2**20, max_inflated_bytes=4 * 2**20)
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        yield c


def started(client: httpx.Client, batch_size: int = 4) -> int:
    """Register a trainer, start it, register one env; return the env id."""
    assert client.post("/register", json=registration_json(batch_size)).status_code == 200
    assert client.get("/batch").json() == {"batch": None}
    return client.post("/register-env", json=ENV).json()["env_id"]


def test_endpoints_before_registration_answer_like_upstream(client):
    assert client.get("/").json() == {"message": "AtroposLib API"}
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert client.get("/wandb_info").json() == {"group": None, "project": None}
    assert client.get("/status").json() == {"current_step": 0, "queue_size": 0}
    reply = client.get("/batch")
    assert reply.status_code == 200
    assert reply.json() == {
        "status": "error",
        "message": "Trainer not registered. Call /register first.",
        "batch": [],
    }
    assert client.get("/batch", params={"lease": 10}).status_code == 409
    assert client.post("/register-env", json=ENV).json() == {"status": "wait for trainer to start"}
    latest = client.get("/latest_example").json()
    assert latest["tokens"] == [] and latest["generation_params"] == []


def test_registration_and_env_flow(client):
    reply = client.post("/register", json=registration_json(4)).json()
    assert isinstance(reply["uuid"], int) and reply["uuid"] < 2**53
    assert client.get("/info").json() == {"batch_size": 4, "max_token_len": 2048}
    assert client.get("/wandb_info").json() == {"group": "g", "project": "p"}
    assert client.post("/register-env", json=ENV).json()["status"] == "wait for trainer to start"
    client.get("/batch")
    env = client.post("/register-env", json=ENV).json()
    assert env == {
        "status": "success",
        "env_id": 0,
        "wandb_name": "env_0",
        "checkpoint_dir": "ckpt",
        "starting_step": 0,
        "checkpoint_interval": 10,
        "num_steps": 100,
    }
    assert client.post("/disconnect-env", json={"env_id": 0}).json() == {"status": "success"}
    assert client.post("/disconnect-env", json={"env_id": 5}).status_code == 404
    assert client.post("/disconnect-env", json={"env_id": -1}).status_code == 422


def test_status_env_takes_a_get_body_a_query_or_a_post(client):
    env_id = started(client)
    client.post("/scored_data", json=group_json(2, env_id=env_id))
    by_body = client.request("GET", "/status-env", content=json.dumps({"env_id": env_id}))
    by_query = client.get("/status-env", params={"env_id": env_id})
    by_post = client.post("/status-env", json={"env_id": env_id})
    assert by_body.json() == by_query.json() == by_post.json()
    assert set(by_body.json()) == {
        "current_step",
        "queue_size",
        "unallocated_fraction",
        "self_queue_size",
        "max_group_size",
        "env_weight",
    }
    assert by_body.json()["self_queue_size"] == 1
    assert client.get("/status-env", params={"env_id": 5}).status_code == 404
    assert client.get("/status-env", params={"env_id": "x"}).status_code == 400
    assert client.get("/status-env").status_code == 422


def test_batches_are_exact_fifo_and_intact(client):
    started(client, batch_size=4)
    sent = [
        group_json(2, tag=1, messages=[[{"role": "user", "content": "hi", "x": 1}]] * 2),
        group_json(1, tag=2, overrides=[{"sft": True}], group_overrides={"sft": True}),
        group_json(3, tag=3, generation_params={"temperature": 0.7}),
        group_json(1, tag=4, inference_logprobs=[[1.0, -0.5, -0.25]]),
    ]
    for g in sent[:2]:
        assert client.post("/scored_data", json=g).json() == {"status": "received"}
    reply = client.post("/scored_data_list", json=sent[2:])
    assert reply.json() == {"status": "received", "groups_processed": 2}
    assert client.get("/status").json()["queue_size"] == 4
    first = client.get("/batch").json()["batch"]
    second = client.get("/batch").json()["batch"]
    assert [len(g["tokens"]) for g in first] == [2, 1, 1]  # 3 does not fit beside 2 + 1
    assert second is None  # the 3 is left: nothing else can complete a batch of 4
    for got in first:
        want = next(s for s in sent if s["tokens"][0][0] == got["tokens"][0][0])
        for key, value in want.items():
            assert got[key] == value
        assert "group_id" not in got  # extension keys appear only when set
    latest = client.get("/latest_example").json()
    assert latest["tokens"][0][0] == 4 and latest["inference_logprobs"] == [[1.0, -0.5, -0.25]]


def test_leases_and_acks_over_http(client):
    started(client, batch_size=2)
    client.post("/scored_data", json=group_json(2, tag=5, group_id="a", policy_version=0))
    reply = client.get("/batch", params={"lease": 30}).json()
    assert reply["step"] == 1 and len(reply["batch_id"]) == 32
    assert reply["batch"][0]["group_id"] == "a" and reply["batch"][0]["policy_version"] == 0
    ack = client.post("/batch/ack", json={"batch_id": reply["batch_id"]})
    assert ack.json() == {"status": "acknowledged"}
    assert client.post("/batch/ack", json={"batch_id": "nope"}).status_code == 404
    for bad in ("0", "-1", "nan", "x", "1e9"):
        assert client.get("/batch", params={"lease": bad}).status_code == 400


BAD_GROUPS = [
    ({"env_id": 7}, "env_id 7"),
    ({"env_id": -1}, "$.env_id"),
    ({"masks": [[1, 2], [1, 2, 3]]}, "masks[0]"),
    ({"masks": [[1, 2, 3]]}, "masks"),
    ({"scores": [1.0]}, "scores"),
    ({"tokens": [["a", 1, 2], [1, 2, 3]]}, "tokens"),
    ({"tokens": []}, "tokens"),
    ({"scores": "high"}, "scores"),
    ({"advantages": [[1.0, 2.0, 3.0]]}, "advantages"),
    ({"messages": [[{"role": "user"}], []]}, "messages[0][0]"),
    ({"overrides": [{}]}, "overrides"),
]


@pytest.mark.parametrize(("change", "named"), BAD_GROUPS)
def test_bad_groups_get_a_4xx_naming_the_field_and_change_nothing(client, change, named):
    started(client)
    reply = client.post("/scored_data", json={**group_json(2), **change})
    assert 400 <= reply.status_code < 500, reply.text
    assert named in reply.json()["detail"]
    listed = client.post("/scored_data_list", json=[group_json(2), {**group_json(2), **change}])
    assert 400 <= listed.status_code < 500
    assert client.get("/status").json()["queue_size"] == 0


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b'{"tokens":[[1]],"masks":[[1]],"scores":[NaN]}', "NaN"),
        (b'{"tokens":[[1]],"masks":[[1]],"scores":[Infinity]}', "Infinity"),
        (b'{"tokens":[[1]],"masks":[[1]],"scores":[1e999]}', "finite"),
        (b'{"tokens":[[1]],"masks":[[1]]}', "scores"),
        (b"{not json", "not valid JSON"),
        (b"[]", "object"),
    ],
)
def test_malformed_bodies_get_a_clear_4xx(client, raw, named):
    started(client)
    reply = client.post("/scored_data", content=raw)
    assert 400 <= reply.status_code < 500
    assert named in reply.json()["detail"]


def test_loose_optional_rows_are_accepted_and_counted(client):
    started(client)
    loose = group_json(2, advantages=[[1.0, 1.0, 1.0, 1.0]] * 2, messages=[])
    assert client.post("/scored_data", json=loose).status_code == 200
    counts = client.get("/stats").json()["envs"]["unassigned"]["loose_fields"]
    assert counts == {"advantages_row_length": 1, "messages_row_count": 1}


def test_gzip_requests_are_inflated_with_a_bound(client):
    started(client)
    body = gzip.compress(json.dumps(group_json(2)).encode())
    ok = client.post("/scored_data", content=body, headers={"content-encoding": "gzip"})
    assert ok.json() == {"status": "received"}
    corrupt = client.post("/scored_data", content=b"xx", headers={"content-encoding": "gzip"})
    assert corrupt.status_code == 400 and "gzip" in corrupt.json()["detail"]
    bomb = gzip.compress(b"[" + b" " * (64 * 2**20) + b"]")
    assert len(bomb) < 2**20
    reply = client.post("/scored_data", content=bomb, headers={"content-encoding": "gzip"})
    assert reply.status_code == 413 and "inflates past" in reply.json()["detail"]
    huge = client.post("/scored_data", content=b" " * (2 * 2**20))
    assert huge.status_code == 413
    assert client.get("/status").json()["queue_size"] == 1


@pytest.mark.parametrize("policy", ["always", "auto"])
def test_responses_are_gzipped_only_above_1000_bytes(policy):
    config = ApiConfig(response_gzip=policy)
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as client:
        started(client, batch_size=2)
        small = client.get("/info", headers={"accept-encoding": "gzip"})
        assert small.headers.get("content-encoding") != "gzip"
        rows = [list(range(100_000))] * 2  # over the threshold for compressing in a thread
        client.post("/scored_data", json={**group_json(2), "tokens": rows, "masks": rows})
        big = client.get("/batch", headers={"accept-encoding": "gzip"})
        # auto: this client is on loopback, where compressing costs more than it saves
        want = "gzip" if policy == "always" else None
        assert big.headers.get("content-encoding") == want
        assert big.json()["batch"][0]["tokens"] == rows


def test_msgpack_bodies_in_and_out(client):
    started(client, batch_size=2)
    body = msgspec.msgpack.encode(group_json(2, tag=9))
    reply = client.post(
        "/scored_data", content=body, headers={"content-type": "application/msgpack"}
    )
    assert reply.json() == {"status": "received"}
    nan = msgspec.msgpack.encode({**group_json(2), "scores": [float("nan"), 1.0]})
    bad = client.post("/scored_data", content=nan, headers={"content-type": "application/msgpack"})
    assert bad.status_code == 422 and "scores[0]" in bad.json()["detail"]
    got = client.get("/batch", params={"lease": 5}, headers={"accept": "application/msgpack"})
    assert got.headers["content-type"] == "application/msgpack"
    doc = msgspec.msgpack.decode(got.content)
    assert doc["batch"][0]["tokens"][0][0] == 9 and doc["batch_id"]


def test_reset_by_get_and_post(client):
    started(client)
    assert client.get("/reset_data").text == "Reset successful"
    assert client.get("/info").json()["batch_size"] == -1
    started(client)
    assert client.post("/reset_data").text == "Reset successful"
    assert client.get("/status").json() == {"current_step": 0, "queue_size": 0}


def test_metrics_and_stats(client):
    env_id = started(client, batch_size=2)
    client.post("/scored_data", json=group_json(2, env_id=env_id))
    client.get("/batch")
    text = client.get("/metrics").text
    assert "atropos_step 1" in text
    assert 'atropos_env_groups_out_total{env="0"} 1' in text
    stats = client.get("/stats").json()
    assert stats["envs"]["0"]["name"] == "env_0" and stats["envs"]["0"]["live"] is True
    assert stats["batch_latency_seconds"]["count"] == 1


def test_rollouts_are_read_without_consuming_anything(client):
    env_id = started(client, batch_size=2)
    for tag in range(5):
        client.post("/scored_data", json=group_json(2, tag=tag, env_id=env_id))
    before = client.get("/status").json()
    page = client.get("/rollouts", params={"limit": 2}).json()
    assert [r["group"]["tokens"][0][0] for r in page["rollouts"]] == [0, 1]
    assert page["rollouts"][0]["env_id"] == env_id and page["missed"] == 0
    rest = client.get("/rollouts", params={"after": page["next"]}).json()
    assert [r["group"]["tokens"][0][0] for r in rest["rollouts"]] == [2, 3, 4]
    done = client.get("/rollouts", params={"after": rest["next"]}).json()
    assert done["rollouts"] == [] and done["next"] == rest["next"]
    assert client.get("/status").json() == before  # nothing consumed
    batch = client.get("/batch").json()["batch"]  # and the trainer still gets everything
    assert [g["tokens"][0][0] for g in batch] == [0]
    again = client.get("/rollouts").json()  # consumed groups stay readable
    assert len(again["rollouts"]) == 5
    for bad in ({"limit": 0}, {"limit": "x"}, {"after": -2}):
        r = client.get("/rollouts", params=bad)
        assert r.status_code == 400 and next(iter(bad)) in r.json()["detail"]


def test_stats_history_samples_over_time():
    config = ApiConfig(history_interval=0.05)
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        c.post("/register", json=registration_json(2))
        c.get("/batch")
        env_id = c.post("/register-env", json=ENV).json()["env_id"]
        c.post("/scored_data", json=group_json(2, env_id=env_id))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            doc = c.get("/stats/history").json()
            if doc["samples"] and doc["samples"][-1]["envs"].get("0", {}).get("groups_in"):
                break
            time.sleep(0.05)
    assert doc["interval"] == 0.05 and len(doc["samples"]) >= 2
    last = doc["samples"][-1]
    assert last["queued_groups"] == 1 and last["envs"]["0"]["groups_in"] == 1
    assert [s["t"] for s in doc["samples"]] == sorted(s["t"] for s in doc["samples"])


def test_api_key_guards_every_endpoint_but_root_and_health():
    config = ApiConfig(api_key="s3cret")
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        assert c.get("/").status_code == 200
        assert c.get("/health").status_code == 200
        for method, path in [
            ("GET", "/info"),
            ("GET", "/batch"),
            ("POST", "/reset_data"),
            ("GET", "/reset_data"),
            ("POST", "/scored_data"),
            ("GET", "/stats"),
            ("GET", "/stats/history"),
            ("GET", "/rollouts"),
        ]:
            assert c.request(method, path).status_code == 401, path
        wrong = c.get("/info", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert c.get("/info", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_no_cors_by_default_and_never_with_credentials():
    with serve_in_thread(create_app()) as url, httpx.Client(base_url=url) as c:
        reply = c.get("/info", headers={"origin": "http://evil.example"})
        assert "access-control-allow-origin" not in reply.headers
    config = ApiConfig(cors_origins=["http://localhost:3000"])
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        ok = c.get("/info", headers={"origin": "http://localhost:3000"})
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "access-control-allow-credentials" not in ok.headers
        other = c.get("/info", headers={"origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_mixed_size_groups_from_one_env_are_batched_without_a_buffer(client):
    """Upstream buffered groups whose size differed from the env's group_size."""
    env_id = started(client, batch_size=8)  # the env registered group_size 2
    for tag, size in enumerate([3, 1, 2, 5, 3, 8]):
        reply = client.post("/scored_data", json=group_json(size, tag=tag, env_id=env_id))
        assert reply.json() == {"status": "received"}
    sizes = []
    while (batch := client.get("/batch").json()["batch"]) is not None:
        sizes.append([len(g["tokens"]) for g in batch])
    assert sizes == [[3, 2, 3], [8]]  # oldest first: the head 3 goes in the first batch
    assert client.get("/status").json()["queue_size"] == 2  # 1 + 5 cannot make 8 yet
    client.post("/scored_data", json=group_json(2, tag=9, env_id=env_id))
    assert [len(g["tokens"]) for g in client.get("/batch").json()["batch"]] == [1, 5, 2]


def test_register_env_accepts_what_upstream_accepted_but_not_nonsense(client):
    started(client)
    for share in (1.5, -0.2, 0.3):
        reply = client.post("/register-env", json={**ENV, "min_batch_allocation": share})
        assert reply.json()["status"] == "success"
    status = client.get("/status-env", params={"env_id": 1}).json()
    assert status["unallocated_fraction"] == 0.0  # 1.5 counts as a whole batch
    for bad in ({"group_size": 0}, {"weight": "heavy"}, {"desired_name": None}):
        assert client.post("/register-env", json={**ENV, **bad}).status_code == 422
    nan = json.dumps({**ENV, "min_batch_allocation": float("nan")})
    assert client.post("/register-env", content=nan).status_code == 422
