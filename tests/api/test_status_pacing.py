"""`/status-env`'s pacing figures under `--max-staleness`, and the discard rule's counts.

Over real HTTP: without the flag the answer is upstream's shape (atroposlib 0.4.0 clients read
the same keys as before); with it the answer adds `max_staleness`, `batch_size`,
`waiting_sequences` (waiting to be batched, every env's) and, once the API dropped some of the
env's groups, `api_dropped` by reason, which `/stats` and `/metrics` count too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

from .conftest import group_json, registration_json

UPSTREAM_KEYS = {
    "current_step",
    "queue_size",
    "unallocated_fraction",
    "self_queue_size",
    "max_group_size",
    "env_weight",
}
PACING_KEYS = {"max_staleness", "batch_size", "waiting_sequences"}


@contextmanager
def api(max_staleness: int | None) -> Iterator[httpx.Client]:
    config = ApiConfig(max_staleness=max_staleness)
    with serve_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as c:
        yield c


def start(c: httpx.Client, batch_size: int = 4) -> tuple[int, int]:
    """Register a trainer (started) and two envs; return their ids."""
    assert c.post("/register", json=registration_json(batch_size)).status_code == 200
    assert c.get("/batch").json() == {"batch": None}
    ids = []
    for name in ("a", "b"):
        env = {"max_token_length": 2048, "desired_name": name, "weight": 1.0, "group_size": 2}
        ids.append(c.post("/register-env", json=env).json()["env_id"])
    return ids[0], ids[1]


def status(c: httpx.Client, env_id: int) -> dict:
    reply = c.post("/status-env", json={"env_id": env_id})
    assert reply.status_code == 200
    return reply.json()


def test_without_max_staleness_the_answer_keeps_upstreams_shape():
    with api(None) as c:
        a, _ = start(c)
        c.post("/scored_data", json=group_json(2, env_id=a))
        assert set(status(c, a)) == UPSTREAM_KEYS


def test_with_max_staleness_the_answer_says_what_pacing_needs():
    with api(2) as c:
        a, b = start(c, batch_size=4)
        got = status(c, a)
        assert set(got) == UPSTREAM_KEYS | PACING_KEYS
        assert (got["max_staleness"], got["batch_size"], got["waiting_sequences"]) == (2, 4, 0)
        for env_id in (a, b, b):
            c.post("/scored_data", json=group_json(2, env_id=env_id, policy_version=0))
        assert status(c, a)["waiting_sequences"] == 6  # every env's waiting sequences
        leased = c.get("/batch", params={"lease": 60}).json()
        assert len(leased["batch"]) == 2
        got = status(c, a)
        # a leased batch is counted in the step, not in the queue
        assert (got["current_step"], got["waiting_sequences"]) == (1, 2)
        assert got["queue_size"] == 1 and got["self_queue_size"] == 0  # upstream's, unchanged


def test_the_discard_rule_counts_what_it_drops_by_env_and_reason():
    with api(0) as c:
        a, b = start(c, batch_size=2)
        c.post("/scored_data", json=group_json(2, env_id=a, policy_version=0))
        assert len(c.get("/batch").json()["batch"]) == 1  # step 1
        assert "api_dropped" not in status(c, a)
        c.post("/scored_data", json=group_json(2, env_id=a, policy_version=0))  # 1 behind
        c.post("/scored_data", json=group_json(2, env_id=b, policy_version=1))
        batch = c.get("/batch").json()["batch"]
        assert [g["env_id"] for g in batch] == [b]
        assert status(c, a)["api_dropped"] == {"stale": 1}
        assert "api_dropped" not in status(c, b)
        stats = c.get("/stats").json()
        assert stats["drops"] == {"stale": 1}
        assert stats["envs"][str(a)]["drops"] == {"stale": 1}
        metrics = c.get("/metrics").text
        assert f'atropos_env_drops_total{{env="{a}",reason="stale"}} 1' in metrics
