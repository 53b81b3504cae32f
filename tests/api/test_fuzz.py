"""Schema fuzzing: requests generated from our OpenAPI document never get a 5xx.

Uses schemathesis' hypothesis strategies directly (one test per operation) against a real
server on loopback, with the trainer registered and one env known so data endpoints reach their
deep paths. `/reset_data` is left out so the state stays interesting for the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atropos.api import ApiConfig, create_app
from atropos.api.openapi import openapi_document
from atropos.testing import serve_in_thread

from .conftest import registration_json

_DOC = openapi_document()
_SCHEMA = schemathesis.openapi.from_dict(
    {**_DOC, "paths": {k: v for k, v in _DOC["paths"].items() if k != "/reset_data"}}
)
OPERATIONS = [result.ok() for result in _SCHEMA.get_all_operations()]


def _live() -> Iterator[httpx.Client]:
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as client:
        client.post("/register", json=registration_json(8))
        client.get("/batch")
        client.post(
            "/register-env",
            json={"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2},
        )
        yield client


live = pytest.fixture(scope="module")(_live)
live_groups = pytest.fixture(scope="module")(_live)  # its own server: the schema fuzz re-registers


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_no_generated_request_gets_a_server_error(operation, live):
    @given(operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case) -> None:
        kwargs = case.as_transport_kwargs(base_url=str(live.base_url))
        reply = live.request(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params"),
            headers={k: v for k, v in (kwargs.get("headers") or {}).items() if k != "User-Agent"},
            json=kwargs.get("json"),
            content=kwargs.get("data") if isinstance(kwargs.get("data"), bytes) else None,
        )
        assert reply.status_code < 500, (case.method, case.path, case.body, reply.text)

    check()


@st.composite
def group_bodies(draw: st.DrawFn) -> tuple[dict, bool]:
    """A well-formed group, then maybe one mutation; returns (body, mutated)."""
    size = draw(st.integers(1, 6))
    lengths = [draw(st.integers(1, 12)) for _ in range(size)]
    tokens = [[draw(st.integers(0, 50_000)) for _ in range(n)] for n in lengths]
    body: dict = {
        "tokens": tokens,
        "masks": [[-100] + row[1:] for row in tokens],
        "scores": [draw(st.floats(-1e6, 1e6)) for _ in range(size)],
        "env_id": draw(st.sampled_from([None, 0])),
    }
    if draw(st.booleans()):
        body["inference_logprobs"] = [[draw(st.floats(-20, 0))] * n for n in lengths]
    if draw(st.booleans()):
        body["messages"] = [[{"role": "user", "content": draw(st.text(max_size=5))}]] * size
    mutations = [
        None,
        lambda b: b.pop(draw(st.sampled_from(["tokens", "masks", "scores"]))),
        lambda b: b["masks"][0].append(1),
        lambda b: b["scores"].append(0.0),
        lambda b: b.__setitem__("env_id", draw(st.sampled_from([-1, 5, "0", 1.5]))),
        lambda b: b.__setitem__(
            draw(st.sampled_from(["tokens", "scores", "masks", "advantages", "overrides"])),
            draw(st.one_of(st.none(), st.text(), st.integers(), st.lists(st.text()))),
        ),
        lambda b: b["tokens"][0].__setitem__(0, draw(st.sampled_from([2**70, -(2**70), "x", 1.5]))),
        lambda b: b.__setitem__("messages", [[{"role": "user"}]] * len(b["tokens"])),
        lambda b: b.__setitem__("advantages", [[1.0]] * (len(b["tokens"]) + 1)),
        lambda b: b.__setitem__("group_id", draw(st.one_of(st.text(), st.integers()))),
        lambda b: b.__setitem__("policy_version", draw(st.one_of(st.integers(), st.text()))),
    ]
    mutate = draw(st.sampled_from(mutations))
    if mutate is not None:
        mutate(body)
    return body, mutate is not None


@given(st.lists(group_bodies(), min_size=1, max_size=3), st.booleans())
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_mutated_groups_get_2xx_or_a_clean_4xx_and_never_half_write(live_groups, bodies, as_list):
    live = live_groups
    before = live.get("/status").json()["queue_size"]
    payload = [b for b, _ in bodies]
    if as_list:
        reply = live.post("/scored_data_list", json=payload)
        expected = len(payload)
    else:
        reply = live.post("/scored_data", json=payload[0])
        expected = 1
    after = live.get("/status").json()["queue_size"]
    assert reply.status_code < 500, reply.text
    if reply.status_code == 200:
        added = expected - reply.json().get("duplicates", int(reply.json().get("duplicate", 0)))
        assert after == before + added
    else:
        assert 400 <= reply.status_code < 500 and reply.json()["detail"]
        assert after == before  # all or nothing
    if not any(mutated for _, mutated in bodies):
        assert reply.status_code == 200, reply.text


# ----- hostile input on every endpoint ---------------------------------------------------------

HOSTILE_SENT = {"requests": 0, "5xx": 0}  # tallied for the closing note (printed with -s)
ENDPOINTS = [
    ("POST", "/register"),
    ("POST", "/register-env"),
    ("POST", "/disconnect-env"),
    ("POST", "/batch/ack"),
    ("POST", "/scored_data"),
    ("POST", "/scored_data_list"),
    ("POST", "/status-env"),
    ("GET", "/status-env"),
    ("GET", "/batch"),
    ("GET", "/rollouts"),
    ("GET", "/stats"),
    ("GET", "/health"),
    ("GET", "/dashboard"),
    ("GET", "/metrics"),
]
GROUP = b'{"tokens":[[1,2]],"masks":[[-100,2]],"scores":[0.5],"env_id":0,"images":%s}'
json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
msgpack_ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry at all
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.floats()
    | msgpack_ints
    | st.binary(max_size=6)
    | st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=4)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(msgpack_ints | st.text(max_size=3) | st.none(), inner, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A hostile body and its content type."""
    kind = draw(st.sampled_from(["deep", "bigint", "nonfinite", "utf8", "msgpack", "json", "raw"]))
    if kind == "deep":
        n = draw(st.integers(1, 4000))
        o, c = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        return GROUP % (o * n + b"1" + c * n), "application/json"
    if kind == "bigint":
        digits = draw(st.integers(18, 5000))
        field = draw(st.sampled_from([b"policy_version", b"env_id", b"images", b"tokens"]))
        value = b"9" * digits if field != b"tokens" else b"[[" + b"9" * digits + b"]]"
        return GROUP.replace(b'"images":%s', b'"%s":%s' % (field, value)), "application/json"
    if kind == "nonfinite":
        bad = draw(st.sampled_from([b'"nan"', b'"-inf"', b"1e999", b"NaN", b"-Infinity"]))
        field = draw(st.sampled_from([b"scores", b"inference_logprobs", b"distill_logprobs"]))
        rows = {b"scores": b"[%s]", b"distill_logprobs": b"[[[%s]]]"}.get(field, b"[[%s,0]]")
        body = GROUP.replace(b'"images":%s', b'"%s":%s' % (field, rows % bad))
        return body, "application/json"
    if kind == "utf8":
        junk = draw(
            st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\\ud800", b"\x00"])
        )
        return GROUP % (b'"' + junk + b'"'), draw(st.sampled_from([None, "application/json"]))
    if kind == "msgpack":
        body = msgspec.msgpack.encode(
            {"tokens": [[1]], "masks": [[1]], "scores": [0.5], "images": draw(msgpack_values)}
        )
        return body, "application/msgpack"
    if kind == "json":
        return msgspec.json.encode(draw(json_values)), "application/json"
    return draw(st.binary(max_size=64)), draw(
        st.sampled_from([None, "application/json", "application/msgpack", "text/plain"])
    )


query_values = st.sampled_from(["--1", "²", "9" * 5000, "1_0", "-1", "nan", "0", "1e9", ""]) | (
    st.text(max_size=6)
)
hostile_headers = st.sampled_from(
    [
        {},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:1"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Host": "attacker.example"},
        {"Content-Encoding": "gzip"},
        {"Authorization": "Bearer " + "x" * 200},
    ]
)


@given(
    st.sampled_from(ENDPOINTS),
    hostile_bodies(),
    st.dictionaries(st.sampled_from(["env_id", "lease", "after", "limit"]), query_values),
    hostile_headers,
)
@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_input_never_gets_a_5xx_and_leaves_the_queue(
    live_groups, endpoint, body, query, extra
):
    live = live_groups
    method, path = endpoint
    payload, ctype = body
    headers = dict(extra)
    if ctype is not None:
        headers.setdefault("Content-Type", ctype)
    before = live.get("/status").json()
    t0 = time.monotonic()
    reply = live.request(method, path, content=payload, params=query, headers=headers)
    took = time.monotonic() - t0
    HOSTILE_SENT["requests"] += 1
    HOSTILE_SENT["5xx"] += reply.status_code >= 500
    assert reply.status_code < 500, (method, path, payload[:200], query, headers, reply.text)
    assert took < 2.0, (method, path, took)
    if reply.status_code >= 400:
        assert reply.json()["detail"]
        assert live.get("/status").json() == before  # refused input changes nothing


@pytest.fixture(scope="module", autouse=True)
def report_hostile_tally() -> Iterator[None]:
    yield
    print(f"\ntest_fuzz hostile: {HOSTILE_SENT['requests']} requests, {HOSTILE_SENT['5xx']} 5xx")
