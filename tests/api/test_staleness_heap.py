"""`--max-staleness` drops from a heap of policy versions (O(stale) per batch): the groups a
scan of the whole queue would drop, after a restart too, and never one that already left."""

from __future__ import annotations

import json

from atropos.api.hub import Hub, HubConfig
from atropos.api.store import MemoryStore, SQLiteStore

from .conftest import Clock, make_group, registration


def started(hub: Hub, batch_size: int) -> Hub:
    hub.register(registration(batch_size))
    assert hub.next_batch(None) is None
    return hub


def tags(served) -> list[int]:
    return [json.loads(b)["tokens"][0][0] for b in served.bodies]


def test_stale_groups_queued_before_a_restart_are_dropped(tmp_path):
    config = HubConfig(max_staleness=1)
    hub = started(Hub(SQLiteStore(tmp_path / "api.db"), config, clock=Clock()), 2)
    hub.ingest([make_group(2, tag=t, policy_version=v) for t, v in ((1, 0), (2, 0), (3, 5))])
    hub.store.close()
    hub = Hub(SQLiteStore(tmp_path / "api.db"), config, clock=Clock())  # a restart
    hub.step = 3  # versions below 2 are stale now
    assert tags(hub.next_batch(None)) == [3]
    assert hub.counters[None].drops == {"stale": 2} and not hub.queue
    hub.store.close()
    again = Hub(SQLiteStore(tmp_path / "api.db"), config)
    assert again.queue == {}  # gone from the store too
    again.store.close()


def test_a_group_that_left_the_queue_is_not_dropped_again():
    hub = started(Hub(MemoryStore(), HubConfig(max_staleness=1), clock=Clock()), 2)
    hub.ingest([make_group(2, tag=1, policy_version=0)])
    assert tags(hub.next_batch(1.0)) == [1]  # leased at step 0: fresh then
    hub.ingest([make_group(2, tag=2, policy_version=5)])
    hub.step = 4  # the leased group's version is stale now, but it is not queued
    assert tags(hub.next_batch(None)) == [2]
    assert hub.counters[None].drops == {} and len(hub.leased) == 1
