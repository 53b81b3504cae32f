"""The SQLite store's body segments: rotation, garbage collection, crash leftovers, reset."""

from __future__ import annotations

import json

import pytest

from atropos.api.store import SQLiteStore, segments
from atropos.api.store.base import NewGroup


def new(i: int, key: str | None = None) -> NewGroup:
    return NewGroup(None, 1, None, 0.0, key, json.dumps({"i": i, "pad": "x" * 100}).encode())


def segment_files(store: SQLiteStore) -> list[str]:
    return sorted(p.name for p in store._log.directory.iterdir())


def test_segments_rotate_and_consumed_ones_are_unlinked(tmp_path, monkeypatch):
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 300)
    store = SQLiteStore(tmp_path / "api.db")
    seqs = [store.add_groups([new(i)])[0] for i in range(8)]
    assert len(segment_files(store)) >= 3
    assert [json.loads(b)["i"] for b in store.bodies(seqs)] == list(range(8))
    store.take(seqs[:6], {})
    assert len(segment_files(store)) <= 2  # only the live tail and the current segment remain
    assert [json.loads(b)["i"] for b in store.bodies(seqs[6:])] == [6, 7]
    store.take(seqs[6:], {})
    assert segment_files(store) == [f"seg-{store._log.current:08d}.log"]
    store.close()


def test_bytes_written_without_a_commit_are_collected_after_a_restart(tmp_path):
    store = SQLiteStore(tmp_path / "api.db")
    [kept] = store.add_groups([new(1)])
    store._log.append([b"orphan: the process died before its commit"])  # a crash right here
    store.close()
    again = SQLiteStore(tmp_path / "api.db")
    assert json.loads(again.bodies([kept])[0])["i"] == 1
    again.take([kept], {})
    assert segment_files(again) == [f"seg-{again._log.current:08d}.log"]
    again.close()


def test_reset_removes_every_body_and_duplicates_inside_one_call_count_once(tmp_path):
    store = SQLiteStore(tmp_path / "api.db")
    out = store.add_groups([new(1, "k"), new(2, "k"), new(3)])
    assert out[1] is None and out[0] is not None and out[2] is not None
    store.reset()
    assert store.load().groups == []
    assert store.add_groups([new(4, "k")])[0] is not None  # reset forgets idempotency keys too
    store.close()


def test_a_store_from_another_schema_version_is_refused(tmp_path):
    store = SQLiteStore(tmp_path / "api.db")
    store.set_meta({"schema_version": 99})
    store.close()
    with pytest.raises(ValueError, match="schema 99"):
        SQLiteStore(tmp_path / "api.db")
