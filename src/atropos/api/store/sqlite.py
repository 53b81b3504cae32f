"""The durable store: SQLite (WAL) for state and metadata, segment files for group bodies.

SQLite runs in WAL mode with `synchronous=NORMAL`: a commit survives the API process being
killed (SIGKILL, OOM) but not a power cut; `sqlite-full:PATH` fsyncs every commit (and the
segment bytes before it). Bodies live in `PATH.bodies/` (see `segments.py` for why).

Every file is the owner's only: the database is created 0600 before SQLite opens it, and SQLite
gives its `-wal` and `-shm` files the database's mode; directories created here are 0700.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atropos.api.store.base import SEEN_KEYS_KEPT, BatchRow, GroupRow, NewGroup, Snapshot
from atropos.api.store.segments import SegmentLog, private_dir, private_file

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS envs(env_id INTEGER PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    env_id INTEGER, size INTEGER NOT NULL, policy_version INTEGER,
    received REAL NOT NULL, batch_id TEXT,
    segment INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches(
    batch_id TEXT PRIMARY KEY, step INTEGER NOT NULL, expires REAL NOT NULL, seqs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seen(group_id TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""

Place = tuple[int, int, int]  # (segment, offset, length)


class SQLiteStore:
    """A store in one SQLite file plus its body segments. Every method is one transaction."""

    def __init__(self, path: str | Path, fsync: bool = False) -> None:
        self.path = Path(path)
        private_dir(self.path.parent, own=False)
        private_file(self.path)
        for suffix in ("-wal", "-shm"):  # left by an older version with a wider mode
            extra = Path(f"{self.path}{suffix}")
            if extra.exists():
                extra.chmod(0o600)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, one transaction per call.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        found = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if found is not None and json.loads(found[0]) != SCHEMA_VERSION:
            raise ValueError(
                f"{self.path} has store schema {found[0]}, this version reads {SCHEMA_VERSION}"
            )
        self._db.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
            (json.dumps(SCHEMA_VERSION),),
        )
        self._log = SegmentLog(Path(f"{self.path}.bodies"), fsync=fsync)
        self._places: dict[int, Place] = {}
        for seq, segment, offset, length in self._db.execute(
            "SELECT seq, segment, offset, length FROM groups"
        ):
            self._places[seq] = (segment, offset, length)
            self._log.track(segment)
        self._log.collect()

    def load(self) -> Snapshot:
        db = self._db
        meta = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}
        meta.pop("schema_version", None)
        envs = {i: json.loads(r) for i, r in db.execute("SELECT env_id, record FROM envs")}
        groups = [
            GroupRow(*row)
            for row in db.execute(
                "SELECT seq, env_id, size, policy_version, received, batch_id"
                " FROM groups ORDER BY seq"
            )
        ]
        batches = [
            BatchRow(b, s, e, json.loads(q))
            for b, s, e, q in db.execute("SELECT batch_id, step, expires, seqs FROM batches")
        ]
        return Snapshot(meta, envs, groups, batches)

    def _set_meta(self, values: dict[str, Any]) -> None:
        if values:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    def set_meta(self, values: dict[str, Any]) -> None:
        with _Transaction(self._db):
            self._set_meta(values)

    def put_env(self, env_id: int, record: dict[str, Any], meta: dict[str, Any]) -> None:
        with _Transaction(self._db):
            self._db.execute(
                "INSERT OR REPLACE INTO envs(env_id, record) VALUES (?, ?)",
                (env_id, json.dumps(record)),
            )
            self._set_meta(meta)

    def add_groups(self, groups: Sequence[NewGroup]) -> list[int | None]:
        out: list[int | None] = []
        added: list[tuple[int, Place]] = []
        places: list[Place] = []
        try:
            self._add(groups, out, added, places)
        except BaseException:
            self._log.undo(places)  # not committed: its bodies leave the disk
            raise
        # committed: only now do the bodies count as live
        for seq, place in added:
            self._places[seq] = place
            self._log.track(place[0])
        return out

    def _add(
        self,
        groups: Sequence[NewGroup],
        out: list[int | None],
        added: list[tuple[int, Place]],
        places: list[Place],
    ) -> None:
        db = self._db
        with _Transaction(db):
            fresh: list[int] = []  # indices of groups that are not duplicates
            keys: set[str] = set()
            for i, g in enumerate(groups):
                key = g.group_id
                if key is not None:
                    hit = db.execute("SELECT 1 FROM seen WHERE group_id = ?", (key,))
                    if key in keys or hit.fetchone() is not None:
                        out.append(None)
                        continue
                    keys.add(key)
                out.append(None)
                fresh.append(i)
            places.extend(self._log.append([groups[i].body for i in fresh]))
            for i, place in zip(fresh, places, strict=True):
                g = groups[i]
                cur = db.execute(
                    "INSERT INTO groups(env_id, size, policy_version, received,"
                    " segment, offset, length) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (g.env_id, g.size, g.policy_version, g.received, *place),
                )
                seq = int(cur.lastrowid or 0)
                if g.group_id is not None:
                    db.execute("INSERT INTO seen(group_id, seq) VALUES (?, ?)", (g.group_id, seq))
                    if seq % 10_000 == 0:
                        db.execute("DELETE FROM seen WHERE seq <= ?", (seq - SEEN_KEYS_KEPT,))
                out[i] = seq
                added.append((seq, place))

    def bodies(self, seqs: Sequence[int]) -> list[bytes]:
        return [self._log.read(*self._places[s]) for s in seqs]

    def take(self, seqs: Sequence[int], meta: dict[str, Any]) -> list[bytes]:
        out = self.bodies(seqs)
        with _Transaction(self._db):
            self._db.executemany("DELETE FROM groups WHERE seq = ?", [(s,) for s in seqs])
            self._set_meta(meta)
        self._release(seqs)
        return out

    def lease(self, batch: BatchRow, meta: dict[str, Any]) -> list[bytes]:
        out = self.bodies(batch.seqs)
        with _Transaction(self._db):
            self._db.execute(
                "INSERT INTO batches(batch_id, step, expires, seqs) VALUES (?, ?, ?, ?)",
                (batch.batch_id, batch.step, batch.expires, json.dumps(batch.seqs)),
            )
            self._db.executemany(
                "UPDATE groups SET batch_id = ? WHERE seq = ?",
                [(batch.batch_id, s) for s in batch.seqs],
            )
            self._set_meta(meta)
        return out

    def relet(self, batch_id: str, expires: float) -> None:
        with _Transaction(self._db):
            self._db.execute(
                "UPDATE batches SET expires = ? WHERE batch_id = ?", (expires, batch_id)
            )

    def ack(self, batch_id: str) -> None:
        found = self._db.execute("SELECT seqs FROM batches WHERE batch_id = ?", (batch_id,))
        row = found.fetchone()
        with _Transaction(self._db):
            self._db.execute("DELETE FROM groups WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))
        if row is not None:
            self._release(json.loads(row[0]))

    def drop(self, seqs: Sequence[int]) -> None:
        with _Transaction(self._db):
            self._db.executemany("DELETE FROM groups WHERE seq = ?", [(s,) for s in seqs])
        self._release(seqs)

    def _release(self, seqs: Sequence[int]) -> None:
        per_segment: Counter[int] = Counter()
        for s in seqs:
            place = self._places.pop(s, None)
            if place is not None:
                per_segment[place[0]] += 1
        for segment, n in per_segment.items():
            self._log.release(segment, n)

    def reset(self) -> None:
        with _Transaction(self._db):
            for table in ("meta", "envs", "groups", "batches", "seen"):
                self._db.execute(f"DELETE FROM {table}")
            self._set_meta({"schema_version": SCHEMA_VERSION})
        self._places.clear()
        self._log.clear()

    def close(self) -> None:
        self._log.close()
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self._db.execute("ROLLBACK")
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error:
            if self._db.in_transaction:  # a failed COMMIT leaves it open: end it, uncommitted
                self._db.execute("ROLLBACK")
            raise
