"""The API's store on disk: refused bodies leave no bytes behind, and every file is private."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from atropos.api.store import NewGroup, SQLiteStore

from .conftest import group_json, registration_json
from .live_api import live_api


def disk_usage(directory: Path) -> int:
    """Bytes allocated to every file under `directory`."""
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def big_group(policy_version: int) -> dict:
    """A group whose JSON body is about 1 MiB."""
    return group_json(size=2, policy_version=policy_version) | {
        "tokens": [list(range(90_000))] * 2,
        "masks": [list(range(90_000))] * 2,
    }


def test_bodies_whose_commit_fails_leave_the_disk(tmp_path):
    store = SQLiteStore(tmp_path / "api.db")
    ok = NewGroup(None, 1, 0, 1.0, None, b"k" * 1000)
    assert store.add_groups([ok]) == [1]
    before = disk_usage(tmp_path / "api.db.bodies")
    for _ in range(20):  # a policy_version SQLite cannot hold fails the insert after the write
        bad = NewGroup(None, 1, 2**63, 1.0, None, b"x" * (1 << 20))
        with pytest.raises(OverflowError):
            store.add_groups([bad])
    assert disk_usage(tmp_path / "api.db.bodies") <= before
    assert store.add_groups([ok]) == [2]  # appends go on at the right offsets
    assert store.bodies([1, 2]) == [b"k" * 1000] * 2
    store.take([1, 2], {})
    assert disk_usage(tmp_path / "api.db.bodies") == 0  # nothing live: the segment is emptied
    store.close()


def test_eighty_refused_bodies_of_a_mib_leave_no_bytes_on_disk(tmp_path):
    with live_api(tmp_path) as api, httpx.Client(base_url=api.url, timeout=30) as client:
        assert client.post("/register", json=registration_json(batch_size=64)).status_code == 200
        assert client.post("/scored_data", json=group_json()).status_code == 200
        run = api.store.parent
        before = disk_usage(run)
        statuses = set()
        for _ in range(80):
            resp = client.post("/scored_data", json=big_group(policy_version=2**63))
            statuses.add(resp.status_code)
        after = disk_usage(run)
    assert statuses and all(s >= 400 for s in statuses), statuses
    assert after - before < 2 << 20, (before, after, statuses)


def test_store_files_are_private_whatever_the_umask(tmp_path):
    with umask(0), live_api(tmp_path) as api:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            assert client.post("/register", json=registration_json()).status_code == 200
            assert client.post("/scored_data", json=group_json()).status_code == 200
            run = api.store.parent
            files = [api.store, *(Path(f"{api.store}{s}") for s in ("-wal", "-shm"))]
            segments = list(Path(f"{api.store}.bodies").iterdir())
            assert segments
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files + segments}
            dirs = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (run, segments[0].parent)}
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}
    assert set(dirs.values()) == {0o700}, {k: oct(v) for k, v in dirs.items()}


def test_an_existing_store_with_a_wide_mode_is_made_private(tmp_path):
    tmp_path.chmod(0o755)
    SQLiteStore(tmp_path / "api.db").close()
    for p in (tmp_path / "api.db", tmp_path / "api.db.bodies"):
        p.chmod(0o755)
    SQLiteStore(tmp_path / "api.db").close()
    assert stat.S_IMODE((tmp_path / "api.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "api.db.bodies").stat().st_mode) == 0o700
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # a directory we did not make stays
