"""The trainer conformance kit: our own trainer client passes it, and a client that breaks a
rule gets that rule reported with the call that broke it."""

from __future__ import annotations

import httpx
import pytest

from atropos import wire
from atropos.client import TrainerClient
from atropos.testing.trainer_conformance import (
    MIN_POLL_INTERVAL,
    RULES,
    ConformanceApi,
    assert_conforms,
    check_trainer,
    synthetic_group,
)

REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 8,
    "max_token_len": 64,
    "checkpoint_dir": "ckpt",
    "save_checkpoint_interval": 1,
    "starting_step": 0,
    "num_steps": 3,
}


def our_trainer(url: str, steps: int = 3, batch_size: int = 8) -> list[list[wire.Group]]:
    """The loop `atropos train` runs, without the model: register, say the served version,
    then per step lease a batch, 'train', publish the new version, acknowledge."""
    api = TrainerClient(url, patience=5)
    got = []
    try:
        api.wait_ready()
        api.register(**{**REGISTRATION, "batch_size": batch_size, "num_steps": steps})
        api.published(0)
        for step in range(1, steps + 1):
            batch = api.next_batch(lease=60, within=10)
            assert batch is not None and batch.batch_id is not None
            got.append(batch.groups)
            api.published(step)
            api.ack(batch.batch_id)
    finally:
        api.close()
    return got


def test_our_trainer_client_conforms() -> None:
    with ConformanceApi(batches=3, expect_batch_size=8, require_lease=True) as api:
        batches = our_trainer(api.url)
        assert api.done.is_set()
    report = api.report()
    assert report.ok, report
    assert report.batches_served == 3 and report.versions == [0, 1, 2, 3]
    for groups in batches:  # exact-size batches of groups that pass the API's own checks
        assert sum(len(g.tokens) for g in groups) == 8
        for g in groups:
            wire.check_group(g)
    assert any(g.advantages is not None for b in batches for g in b)
    assert any(g.overrides is not None for b in batches for g in b)
    assert "conforms to contract 1.0" in str(report)


def test_assert_conforms_runs_the_trainer_and_returns_the_report() -> None:
    report = assert_conforms(lambda url: our_trainer(url, batch_size=6), batches=3)
    assert report.batches_served == 3  # 6 = one group of 4 and one of 2: groups never split


def bad_trainer(url: str) -> None:
    """Batch before register, a tight poll loop, leases never acknowledged, versions going
    backwards."""
    with httpx.Client(base_url=url) as http:
        http.get("/batch")
        http.post("/register", json=REGISTRATION)
        got = 0
        while got < 2:
            if http.get("/batch", params={"lease": 30}).json()["batch"] is not None:
                got += 1
        http.post("/policy_version", json={"version": 2})
        http.post("/policy_version", json={"version": 1})


def test_a_bad_trainer_gets_every_rule_it_broke_reported() -> None:
    report = check_trainer(bad_trainer, batches=3, empty_polls=5)
    assert not report.ok
    assert report.broken == {"register_first", "backoff", "ack", "policy_version"}, report
    by_rule = {v.rule: v for v in report.violations}
    first = by_rule["register_first"].call
    assert first is not None and first.index == 0 and first.path == "/batch"
    backoff = by_rule["backoff"]
    assert backoff.call is not None and backoff.call.path == "/batch"
    assert f"{MIN_POLL_INTERVAL * 1e3:.0f} ms" in backoff.message
    unacked = [v for v in report.violations if v.rule == "ack"]
    assert len(unacked) == 2 and "conformance-1" in unacked[0].message
    going_down = by_rule["policy_version"]
    assert going_down.call is not None and going_down.call.body == {"version": 1}
    text = str(report)
    assert "register_first" in text and "call #0" in text
    with pytest.raises(AssertionError, match="never acknowledged"):
        report.assert_ok()


def test_batch_size_of_one_prompt_s_generations_is_reported() -> None:
    """axolotl's plugin registers batch_size = num_generations: one prompt per batch."""

    def axolotl_like(url: str) -> None:
        with httpx.Client(base_url=url) as http:
            http.post("/register", json={**REGISTRATION, "batch_size": 4})

    report = check_trainer(axolotl_like, expect_batch_size=32, require_publish=False)
    assert report.broken == {"batch_size"}
    assert "expected 32" in report.violations[0].message

    def smaller_than_a_group(url: str) -> None:
        with httpx.Client(base_url=url) as http:
            http.post("/register", json={**REGISTRATION, "batch_size": 2, "max_token_len": 3})

    report = check_trainer(smaller_than_a_group, group_size=4, require_publish=False)
    assert report.broken == {"batch_size", "max_token_len"}
    assert "not generations per prompt" in str(report)


def test_scripted_batches_must_match_the_registered_batch_size() -> None:
    script = [[synthetic_group(4, 0), synthetic_group(2, 1)]]

    def register(url: str) -> None:
        httpx.post(f"{url}/register", json=REGISTRATION)

    report = check_trainer(register, batches=script, require_publish=False)
    assert report.broken == {"batch_size"} and "[6]" in str(report)


def test_plain_gets_leases_acks_versions_and_bodies() -> None:
    with ConformanceApi(batches=2, empty_polls=0, require_lease=True) as api:
        with httpx.Client(base_url=api.url) as http:
            assert http.post("/register", json={"batch_size": 8}).status_code == 422
            assert http.post("/register", json=REGISTRATION).json() == {"uuid": 1}
            plain = http.get("/batch")
            assert plain.headers[wire.CONTRACT_HEADER] == wire.CONTRACT_VERSION
            answer = wire.decode(plain.content, wire.BatchAnswer)
            assert answer.batch is not None and answer.batch_id is None
            leased = wire.decode(http.get("/batch?lease=5").content, wire.BatchAnswer)
            assert leased.batch_id == "conformance-2" and leased.step == 2
            assert http.get("/batch?lease=-1").status_code == 400
            assert http.post("/batch/ack", json={"batch_id": "nope"}).status_code == 404
            assert http.post("/batch/ack", json={"batch_id": "conformance-2"}).status_code == 200
            assert http.post("/policy_version", json={"version": 9}).status_code == 200
            assert http.get("/status").json() == {"current_step": 2, "queue_size": 0}
            assert http.get("/nothing").status_code == 404
            form = http.post("/register", content=b"a=1", headers={"content-type": "text/plain"})
            assert form.status_code == 415
        assert api.done.is_set()
    report = api.report()
    expected = {"valid_body", "lease", "ack", "policy_version", "known_route", "http_rules"}
    assert report.broken == expected, report
    assert expected <= set(RULES)


def test_a_trainer_that_never_publishes_and_a_restart_that_gets_its_lease_back() -> None:
    with ConformanceApi(batches=2, empty_polls=0) as api:
        with httpx.Client(base_url=api.url) as http:
            http.post("/register", json=REGISTRATION)
            first = http.get("/batch", params={"lease": 30}).json()
            http.post("/register", json=REGISTRATION)  # a restarted trainer
            again = http.get("/batch", params={"lease": 30}).json()
            assert again["batch_id"] == first["batch_id"] and again["batch"] == first["batch"]
            http.post("/batch/ack", json={"batch_id": first["batch_id"]})
    report = api.report()
    assert report.broken == {"publish"}, report
    assert report.violations[0].call is None


def test_a_resumed_trainer_may_publish_a_lower_version_after_registering_again() -> None:
    with ConformanceApi(batches=1, empty_polls=0) as api:
        with httpx.Client(base_url=api.url) as http:
            http.post("/register", json=REGISTRATION)
            http.post("/policy_version", json={"version": 0})
            batch_id = http.get("/batch", params={"lease": 30}).json()["batch_id"]
            http.post("/policy_version", json={"version": 1})
            http.post("/register", json=REGISTRATION)  # resumed from the step-0 checkpoint
            http.post("/policy_version", json={"version": 0})
            http.post("/batch/ack", json={"batch_id": batch_id})
    report = api.report()
    assert report.ok, report
    assert report.versions == [0, 1, 0]


def test_msgpack_and_gzip_bodies_are_read_and_msgpack_batches_sent() -> None:
    import gzip

    import msgspec

    with ConformanceApi(batches=1, empty_polls=0, require_publish=False) as api:
        with httpx.Client(base_url=api.url) as http:
            packed = msgspec.msgpack.encode(REGISTRATION)
            mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
            assert http.post("/register", content=packed, headers=mp).status_code == 200
            answer = http.get("/batch", params={"lease": 5}, headers=mp)
            assert answer.headers["content-type"] == "application/msgpack"
            leased = msgspec.msgpack.decode(answer.content, type=wire.BatchAnswer)
            assert leased.batch is not None and leased.batch_id == "conformance-1"
            ack = gzip.compress(msgspec.json.encode({"batch_id": leased.batch_id}))
            zipped = {"content-type": "application/json", "content-encoding": "gzip"}
            assert http.post("/batch/ack", content=ack, headers=zipped).status_code == 200
    report = api.report()
    assert report.ok, report
