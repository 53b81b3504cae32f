"""Every input an adversarial probe turned into a 500 is now a 4xx naming what is wrong; the
queue is unchanged by it; and an exception no check foresaw is answered on the same connection,
logged once with its traceback and counted in `/stats` and `/metrics`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from atropos import wire
from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import group_json, registration_json

ENV = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2}
MSGPACK = {"Content-Type": "application/msgpack"}
SENT = {"requests": 0, "5xx": 0}  # tallied for the closing note (printed with -s)


def _tally(response: httpx.Response) -> None:
    SENT["requests"] += 1
    SENT["5xx"] += response.status_code >= 500


@pytest.fixture(scope="module", autouse=True)
def report_tally() -> Iterator[None]:
    yield
    print(f"\ntest_hostile: {SENT['requests']} requests, {SENT['5xx']} answered 5xx")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[httpx.Client]:
    """A started run on the durable store (where 64-bit overflows used to surface)."""
    config = ApiConfig(store=f"sqlite:{tmp_path / 'api.db'}")
    hooks: dict[str, list[Any]] = {"response": [_tally]}
    with (
        serve_in_thread(create_app(config)) as url,
        httpx.Client(base_url=url, event_hooks=hooks) as c,
    ):
        assert c.post("/register", json=registration_json(4)).status_code == 200
        c.get("/batch")
        assert c.post("/register-env", json=ENV).json()["env_id"] == 0
        assert c.post("/scored_data", json=group_json(2, tag=1, env_id=0)).status_code == 200
        yield c


def refused(reply: httpx.Response, status: int, *named: str) -> None:
    assert reply.status_code == status, reply.text
    detail = reply.json()["detail"]
    for word in named:
        assert word in detail, detail


def queue(c: httpx.Client) -> Any:
    return c.get("/status").json(), c.get("/latest_example").json()


# ----- query integers -----------------------------------------------------------------------------

BAD_INTS = ["--1", "²", "9" * 5000, "1_0", " 1", "٣", "-1", "2147483648", ""]


@pytest.mark.parametrize("raw", BAD_INTS, ids=lambda r: repr(r[:8]))
def test_a_bad_env_id_in_the_query_is_a_400_on_every_path(api, raw):
    for method, path in [
        ("GET", "/health"),
        ("GET", "/dashboard"),
        ("GET", "/"),
        ("GET", "/status"),
        ("GET", "/stats"),
        ("GET", "/batch"),
        ("GET", "/status-env"),
        ("POST", "/scored_data"),
    ]:
        refused(api.request(method, path, params={"env_id": raw}), 400, "env_id")


@pytest.mark.parametrize("name", ["after", "limit"])
def test_rollouts_paging_parameters_are_strict(api, name):
    for raw in ("²", "9" * 5000, "1_0", "0x1"):
        refused(api.get("/rollouts", params={name: raw}), 400, name)


# ----- nesting, encodings, sizes of numbers -------------------------------------------------------


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/scored_data", b'{"tokens":[[1]],"masks":[[1]],"scores":[1],"images":%s}'),
        (
            "/scored_data",
            b'{"tokens":[[1]],"masks":[[1]],"scores":[1],"generation_params":{"a":%s}}',
        ),
        (
            "/scored_data",
            b'{"tokens":[[1]],"masks":[[1]],"scores":[1],'
            b'"messages":[[{"role":"user","content":%s}]]}',
        ),
        (
            "/scored_data_list",
            b'[{"tokens":[[1]],"masks":[[1]],"scores":[1],"overrides":[{"a":%s}]}]',
        ),
        ("/register", b'{"wandb_group":"g","x":%s}'),
        ("/register-env", b'{"desired_name":"e","x":%s}'),
        ("/status-env", b'{"env_id":0,"x":%s}'),
        ("/batch/ack", b'{"batch_id":"b","x":%s}'),
        ("/disconnect-env", b'{"env_id":0,"x":%s}'),
    ],
)
def test_deep_nesting_is_refused(api, path, template):
    before = queue(api)
    refused(api.post(path, content=template % deep(5000)), 400, "deep")
    assert queue(api) == before


def test_free_form_fields_may_nest_64_levels_and_no_more(api):
    body = b'{"tokens":[[1]],"masks":[[1]],"scores":[1],"images":%s}'
    assert api.post("/scored_data", content=body % deep(wire.DEPTH_MAX)).status_code == 200
    before = queue(api)
    refused(api.post("/scored_data", content=body % deep(wire.DEPTH_MAX + 1)), 400, "$.images")
    assert queue(api) == before


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\\ud800"])
def test_invalid_utf8_and_lone_surrogates_are_a_400(api, raw):
    before = queue(api)
    group = b'{"tokens":[[1]],"masks":[[1]],"scores":[1],"images":"a%sb"}' % raw
    refused(api.post("/scored_data", content=group), 400)
    refused(api.post("/scored_data", content=group.replace(b'"images"', b'"group_id"')), 400)
    env = b'{"max_token_length":64,"desired_name":"e%s","weight":1,"group_size":2}' % raw
    refused(api.post("/register-env", content=env), 400)
    if not raw.startswith(b"\\"):  # a msgpack str of invalid UTF-8
        packed = msgspec.msgpack.encode({"batch_id": "x"}).replace(b"\xa1x", b"\xa2" + raw[:2])
        refused(api.post("/batch/ack", content=packed, headers=MSGPACK), 400, "UTF-8")
    assert queue(api) == before


@pytest.mark.parametrize("msgpack", [False, True])
def test_policy_version_past_2_53_is_refused_and_batches_still_form(api, msgpack):
    before = queue(api)
    for version in (2**63, 2**64 - 1, wire.STEP_MAX + 1, -1):
        group = group_json(2, tag=2, env_id=0, policy_version=version)
        if msgpack:
            reply = api.post("/scored_data", content=msgspec.msgpack.encode(group), headers=MSGPACK)
        else:
            reply = api.post("/scored_data", json=group)
        refused(reply, 422, "policy_version")
    assert queue(api) == before
    top = group_json(2, tag=2, env_id=0, policy_version=wire.STEP_MAX)
    assert api.post("/scored_data", json=top).status_code == 200
    batch = api.get("/batch", params={"lease": 10}).json()["batch"]
    assert [g.get("policy_version") for g in batch] == [None, wire.STEP_MAX]


@pytest.mark.parametrize(
    "value",
    [msgspec.msgpack.Ext(5, b"ab"), {None: 1}, {1: 2}],
    ids=["ext", "nil-key", "int-key"],
)
@pytest.mark.parametrize("field", ["images", "generation_params", "group_overrides"])
def test_msgpack_values_without_a_json_form_are_refused(api, field, value):
    before = queue(api)
    wrapped = value if field == "images" else {"k": value}
    packed = msgspec.msgpack.encode(group_json(2, env_id=0, **{field: wrapped}))
    refused(api.post("/scored_data", content=packed, headers=MSGPACK), 400, f"$.{field}")
    assert queue(api) == before


def test_msgpack_map_with_an_array_key_is_refused(api):
    # {"images": {[1]: 1}}: a map whose key is an array (no Python or JSON form)
    head = msgspec.msgpack.encode(group_json(1, env_id=0))
    packed = bytes([head[0] + 1]) + head[1:] + b"\xa6images" + b"\x81\x91\x01\x01"
    reply = api.post("/scored_data", content=packed, headers=MSGPACK)
    assert 400 <= reply.status_code < 500 and "images" in reply.json()["detail"], reply.text


# ----- registrations can never break later requests -----------------------------------------------


def test_register_bounds_starting_step_and_batch_size(api):
    for field, value in [
        ("starting_step", 2**63 - 1),
        ("starting_step", wire.STEP_MAX + 1),
        ("batch_size", wire.SIZE_MAX + 1),
        ("max_token_len", 10**400),
        ("num_steps", 2**40),
        ("checkpoint_dir", "x" * (wire.PATH_MAX + 1)),
    ]:
        refused(api.post("/register", json={**registration_json(4), field: value}), 422, field)
    assert api.get("/batch", params={"lease": 10}).status_code == 200
    top = {**registration_json(4), "starting_step": wire.STEP_MAX}
    assert api.post("/register", json=top).status_code == 200
    api.post("/scored_data", json=group_json(2, tag=3, env_id=0))
    api.post("/scored_data", json=group_json(2, tag=4, env_id=0))
    assert api.get("/batch", params={"lease": 10}).json()["step"] == wire.STEP_MAX + 1
    assert api.get("/status").status_code == 200


def test_one_env_cannot_break_another(api):
    for field, value in [
        ("max_token_length", int("9" * 400)),
        ("max_token_length", 2**31),
        ("weight", 1e300),
        ("weight", "nan"),
        ("group_size", wire.SIZE_MAX + 1),
        ("desired_name", "n" * (wire.NAME_MAX + 1)),
        ("min_batch_allocation", "inf"),
    ]:
        reply = api.post("/register-env", json={**ENV, field: value})
        refused(reply, 422, field)
    extreme = {**ENV, "max_token_length": 2**31 - 1, "weight": wire.WEIGHT_MAX}
    assert api.post("/register-env", json=extreme).json()["env_id"] == 1
    for env_id in (0, 1):
        assert api.get("/status-env", params={"env_id": env_id}).status_code == 200


def test_an_env_id_past_2_31_is_refused(api):
    refused(api.post("/disconnect-env", json={"env_id": 2**31}), 422, "env_id")
    refused(api.post("/scored_data", json=group_json(2, env_id=2**63)), 422, "env_id")


# ----- non-finite floats --------------------------------------------------------------------------

FLOAT_FIELDS = ["scores", "advantages", "ref_logprobs", "inference_logprobs", "distill_logprobs"]


def _with(field: str, bad: Any) -> dict[str, Any]:
    group = group_json(1, env_id=0)
    if field == "scores":
        group["scores"] = [bad]
    elif field == "distill_logprobs":
        group.update(distill_token_ids=[[[1], [2]]], distill_logprobs=[[[bad], [-1.0]]])
    else:
        group[field] = [[0.0, bad, 0.0]]
    return group


@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_refused_naming_the_field(api, field):
    before = queue(api)
    for bad in ("nan", "-inf", "Infinity"):  # strings, as lax decoding reads them
        refused(api.post("/scored_data", json=_with(field, bad)), 422, field, "finite")
    refused(api.post("/scored_data", content=b'{"scores":[1e999]}'), 422)
    for bad in (float("nan"), float("inf")):
        packed = msgspec.msgpack.encode(_with(field, bad))
        reply = api.post("/scored_data", content=packed, headers=MSGPACK)
        refused(reply, 422, field, "finite")
    assert queue(api) == before


# ----- the last line of defence -------------------------------------------------------------------


def test_an_unexpected_exception_is_answered_logged_once_and_counted(api, monkeypatch, caplog):
    from atropos.api.hub import Hub

    def boom(self: Hub) -> dict[str, Any]:
        raise RuntimeError("a bug")

    def too_deep(self: Hub) -> dict[str, Any]:
        raise RecursionError("input-driven")

    monkeypatch.setattr(Hub, "status", boom)
    with caplog.at_level(logging.ERROR, logger="atropos.api"):
        reply = api.get("/status")
        assert reply.status_code == 500 and "internal error #1" in reply.json()["detail"]
        assert reply.headers.get("connection") != "close"
        SENT["5xx"] -= 1  # the injected bug, not hostile input: the tally counts input only
        monkeypatch.setattr(Hub, "status", too_deep)
        refused(api.get("/status"), 400, "RecursionError")
    records = [r for r in caplog.records if r.name == "atropos.api"]
    assert len(records) == 2 and all(r.exc_info for r in records)
    assert api.get("/stats").json()["internal_errors"] == 2
    assert "atropos_internal_errors_total 2" in api.get("/metrics").text
    assert api.get("/health").json() == {"status": "ok"}  # the server carries on
