"""Groups stored as they came: the fast path stores what re-encoding would, or steps aside.

The rule (atropos/api/ingest.py): whatever path a group takes, the stored document reads back,
with Python's `json` (which tells 1 from 1.0), exactly as `wire.encode_group` of the decoded
group does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from atropos import wire
from atropos.api import ApiConfig, create_app, ingest
from atropos.testing import serve_in_thread

from .conftest import registration_json

BASE = b'"tokens":[[5,1,2],[6,1,2]],"masks":[[-100,1,2],[-100,1,2]],"scores":[1.0,-0.5]'
FAST = [
    b"{" + BASE + b"}",
    b"{" + BASE + b',"inference_logprobs":[[1.0,-0.25,-1e-3],[1.0,-2.5,-0.5]]}',
    b"{" + BASE + b',"group_id":"g-1","policy_version":3,"env_id":0,"advantages":null}',
    b'  {"scores":[0.0,1.0],"masks":[[1],[2]],"tokens":[[1],[2]],"distill_token_ids":null}\n',
    json.dumps(
        {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [0.5], "group_id": "x"}
    ).encode(),
]
SLOW = {  # each re-encodes: the bytes would read back differently
    "int score": b'{"tokens":[[1]],"masks":[[1]],"scores":[1]}',
    "int logprob": b"{" + BASE + b',"inference_logprobs":[[1.0,2,-0.5],[1.0,-2.5,-0.5]]}',
    "null extension": b"{" + BASE + b',"group_id":null}',
    "unknown key": b"{" + BASE + b',"extra":{"a":1}}',
    "free-form": b"{" + BASE + b',"messages":[[{"role":"user","content":"hi"}],[]]}',
    "escape": b"{" + BASE + b',"group_id":"a\\u0041"}',
    "lax string": b'{"tokens":[[1]],"masks":[[1]],"scores":["0.5"]}',
    "space in a name": b'{"tokens": [[1]], "masks": [[1]], "scores": [0.5], "group_id": "a b"}',
}


def typed(value: object) -> object:
    """A JSON value with each number's type kept, so that 1 and 1.0 differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def same_document(stored: bytes, group: wire.Group) -> bool:
    return typed(json.loads(stored)) == typed(json.loads(wire.encode_group(group)))


@pytest.mark.parametrize("raw", FAST)
def test_a_group_already_in_stored_form_is_stored_as_it_came(raw):
    group, stored = ingest.decode_group(raw)
    compact = raw.translate(None, b" \n")
    assert stored is not None and stored.startswith(compact[:-1])  # + absent keys as null
    assert b" " not in stored
    assert same_document(stored, group)
    assert group == wire.decode_group(raw)


@pytest.mark.parametrize("raw", SLOW.values(), ids=SLOW.keys())
def test_other_groups_are_re_encoded(raw):
    group, stored = ingest.decode_group(raw)
    assert stored is None
    assert group == wire.decode_group(raw)


def test_a_list_takes_the_path_of_each_element_and_errors_name_the_element():
    raw = b"[" + b",".join([FAST[1], SLOW["int score"], FAST[3]]) + b"]"
    decoded = ingest.decode_group_list(raw)
    assert [stored is None for _, stored in decoded] == [False, True, False]
    assert [g for g, _ in decoded] == wire.decode_group_list(raw)
    bad = b"[" + FAST[0] + b',{"tokens":1,"masks":[],"scores":[]}]'
    with pytest.raises(wire.ProtocolError, match=r"\$\[1\]\.tokens"):
        ingest.decode_group_list(bad)
    packed = msgspec.msgpack.encode([msgspec.json.decode(FAST[0])])
    assert [stored for _, stored in ingest.decode_group_list(packed, msgpack=True)] == [None]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as c:
        yield c


def test_trainers_read_the_same_batch_whichever_path_a_group_took(client):
    assert client.post("/register", json=registration_json(4)).status_code == 200
    client.get("/batch")
    sent = [FAST[1], SLOW["int logprob"]]
    for raw in sent:
        reply = client.post("/scored_data", content=raw)
        assert reply.status_code == 200, reply.text
    batch = json.loads(client.get("/batch").content)["batch"]
    expected = [json.loads(wire.encode_group(wire.decode_group(raw))) for raw in sent]
    assert typed(batch) == typed(expected)
    assert batch[1]["inference_logprobs"][0][1] == 2.0  # the int came back as a float
    assert typed(client.get("/latest_example").json()) == typed(expected[1])
