"""Durable storage behind the trajectory API: SQLite (default) and memory (tests, throwaway runs).

The API keeps its indexes in memory and writes every state change through a store before it
answers, so a 2xx means committed. Group bodies live only in the store; memory holds a few
numbers per group. Stores are chosen by a spec string: `sqlite:PATH` or `memory`.

SQLite runs in WAL mode with `synchronous=NORMAL`: a commit survives the API process being
killed (SIGKILL, OOM) but not a power cut; `sqlite-full:PATH` adds an fsync per commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

SEEN_KEYS_KEPT = 1_000_000  # idempotency keys remembered after their group left the queue


@dataclass(slots=True)
class GroupRow:
    """A queued group as the API indexes it in memory."""

    seq: int  # store-assigned, increasing: queue order across restarts
    env_id: int | None
    size: int
    policy_version: int | None
    received: float
    batch_id: str | None = None  # set while the group sits in a leased batch


@dataclass(slots=True)
class NewGroup:
    """A group about to be stored."""

    env_id: int | None
    size: int
    policy_version: int | None
    received: float
    group_id: str | None
    body: bytes


@dataclass(slots=True)
class BatchRow:
    """A leased batch awaiting acknowledgement."""

    batch_id: str
    step: int
    expires: float
    seqs: list[int]


@dataclass
class Snapshot:
    """Everything a restarted API needs to carry on."""

    meta: dict[str, Any] = field(default_factory=dict)
    envs: dict[int, dict[str, Any]] = field(default_factory=dict)
    groups: list[GroupRow] = field(default_factory=list)
    batches: list[BatchRow] = field(default_factory=list)


class Store(Protocol):
    """What the API needs from storage. Each call is one atomic transaction."""

    def load(self) -> Snapshot: ...
    def set_meta(self, values: dict[str, Any]) -> None: ...
    def put_env(self, env_id: int, record: dict[str, Any], meta: dict[str, Any]) -> None: ...
    def add_groups(self, groups: Sequence[NewGroup]) -> list[int | None]: ...
    def bodies(self, seqs: Sequence[int]) -> list[bytes]: ...
    def take(self, seqs: Sequence[int], meta: dict[str, Any]) -> list[bytes]: ...
    def lease(self, batch: BatchRow, meta: dict[str, Any]) -> list[bytes]: ...
    def relet(self, batch_id: str, expires: float) -> None: ...
    def ack(self, batch_id: str) -> None: ...
    def drop(self, seqs: Sequence[int]) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...


class MemoryStore:
    """A store that keeps everything in this process: fast, and gone when it exits."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._meta: dict[str, Any] = {}
        self._envs: dict[int, dict[str, Any]] = {}
        self._bodies: dict[int, bytes] = {}
        self._rows: dict[int, GroupRow] = {}
        self._batches: dict[str, BatchRow] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._next_seq = 1

    def load(self) -> Snapshot:
        return Snapshot(
            dict(self._meta),
            dict(self._envs),
            list(self._rows.values()),
            list(self._batches.values()),
        )

    def set_meta(self, values: dict[str, Any]) -> None:
        self._meta.update(values)

    def put_env(self, env_id: int, record: dict[str, Any], meta: dict[str, Any]) -> None:
        self._envs[env_id] = dict(record)
        self._meta.update(meta)

    def add_groups(self, groups: Sequence[NewGroup]) -> list[int | None]:
        out: list[int | None] = []
        for g in groups:
            if g.group_id is not None:
                if g.group_id in self._seen:
                    out.append(None)
                    continue
                self._seen[g.group_id] = None
                if len(self._seen) > SEEN_KEYS_KEPT:
                    self._seen.popitem(last=False)
            seq = self._next_seq
            self._next_seq += 1
            self._bodies[seq] = g.body
            self._rows[seq] = GroupRow(seq, g.env_id, g.size, g.policy_version, g.received)
            out.append(seq)
        return out

    def bodies(self, seqs: Sequence[int]) -> list[bytes]:
        return [self._bodies[s] for s in seqs]

    def take(self, seqs: Sequence[int], meta: dict[str, Any]) -> list[bytes]:
        out = [self._bodies.pop(s) for s in seqs]
        for s in seqs:
            self._rows.pop(s, None)
        self._meta.update(meta)
        return out

    def lease(self, batch: BatchRow, meta: dict[str, Any]) -> list[bytes]:
        self._batches[batch.batch_id] = BatchRow(
            batch.batch_id, batch.step, batch.expires, list(batch.seqs)
        )
        for s in batch.seqs:
            self._rows[s].batch_id = batch.batch_id
        self._meta.update(meta)
        return [self._bodies[s] for s in batch.seqs]

    def relet(self, batch_id: str, expires: float) -> None:
        self._batches[batch_id].expires = expires

    def ack(self, batch_id: str) -> None:
        batch = self._batches.pop(batch_id)
        for s in batch.seqs:
            self._bodies.pop(s, None)
            self._rows.pop(s, None)

    def drop(self, seqs: Sequence[int]) -> None:
        for s in seqs:
            self._bodies.pop(s, None)
            self._rows.pop(s, None)

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS envs(env_id INTEGER PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    env_id INTEGER, size INTEGER NOT NULL, policy_version INTEGER,
    received REAL NOT NULL, batch_id TEXT, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches(
    batch_id TEXT PRIMARY KEY, step INTEGER NOT NULL, expires REAL NOT NULL, seqs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seen(group_id TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""


class SQLiteStore:
    """A store in one SQLite file (WAL mode). Every method is one transaction."""

    def __init__(self, path: str | Path, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, one transaction per call.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._db.executescript(_SCHEMA)

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def load(self) -> Snapshot:
        db = self._db
        meta = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}
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
        with self._tx():
            self._set_meta(values)

    def put_env(self, env_id: int, record: dict[str, Any], meta: dict[str, Any]) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO envs(env_id, record) VALUES (?, ?)",
                (env_id, json.dumps(record)),
            )
            self._set_meta(meta)

    def add_groups(self, groups: Sequence[NewGroup]) -> list[int | None]:
        out: list[int | None] = []
        db = self._db
        with self._tx():
            for g in groups:
                if g.group_id is not None:
                    hit = db.execute("SELECT 1 FROM seen WHERE group_id = ?", (g.group_id,))
                    if hit.fetchone() is not None:
                        out.append(None)
                        continue
                cur = db.execute(
                    "INSERT INTO groups(env_id, size, policy_version, received, body)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (g.env_id, g.size, g.policy_version, g.received, g.body),
                )
                seq = int(cur.lastrowid or 0)
                if g.group_id is not None:
                    db.execute("INSERT INTO seen(group_id, seq) VALUES (?, ?)", (g.group_id, seq))
                    if seq % 10_000 == 0:
                        db.execute("DELETE FROM seen WHERE seq <= ?", (seq - SEEN_KEYS_KEPT,))
                out.append(seq)
        return out

    def _bodies(self, seqs: Sequence[int]) -> list[bytes]:
        found: dict[int, bytes] = {}
        for chunk in _chunks(seqs, 500):
            marks = ",".join("?" * len(chunk))
            found.update(
                self._db.execute(f"SELECT seq, body FROM groups WHERE seq IN ({marks})", chunk)
            )
        return [found[s] for s in seqs]

    def bodies(self, seqs: Sequence[int]) -> list[bytes]:
        return self._bodies(seqs)

    def take(self, seqs: Sequence[int], meta: dict[str, Any]) -> list[bytes]:
        with self._tx():
            out = self._bodies(seqs)
            self._delete(seqs)
            self._set_meta(meta)
        return out

    def lease(self, batch: BatchRow, meta: dict[str, Any]) -> list[bytes]:
        with self._tx():
            out = self._bodies(batch.seqs)
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
        with self._tx():
            self._db.execute(
                "UPDATE batches SET expires = ? WHERE batch_id = ?", (expires, batch_id)
            )

    def ack(self, batch_id: str) -> None:
        with self._tx():
            self._db.execute("DELETE FROM groups WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))

    def _delete(self, seqs: Iterable[int]) -> None:
        self._db.executemany("DELETE FROM groups WHERE seq = ?", [(s,) for s in seqs])

    def drop(self, seqs: Sequence[int]) -> None:
        with self._tx():
            self._delete(seqs)

    def reset(self) -> None:
        with self._tx():
            for table in ("meta", "envs", "groups", "batches", "seen"):
                self._db.execute(f"DELETE FROM {table}")

    def close(self) -> None:
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _chunks(seq: Sequence[int], n: int) -> Iterable[list[int]]:
    for i in range(0, len(seq), n):
        yield list(seq[i : i + n])


def open_store(spec: str) -> Store:
    """Open a store from its spec: `memory`, `sqlite:PATH` or `sqlite-full:PATH`.

    >>> type(open_store("memory")).__name__
    'MemoryStore'
    """
    if spec == "memory":
        return MemoryStore()
    kind, sep, path = spec.partition(":")
    if sep and path and kind in ("sqlite", "sqlite-full"):
        return SQLiteStore(path, fsync=kind == "sqlite-full")
    raise ValueError(f"unknown store {spec!r}: use 'memory', 'sqlite:PATH' or 'sqlite-full:PATH'")
