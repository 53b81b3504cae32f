"""A store that keeps everything in this process: fast, and gone when it exits (tests, demos)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from atropos.api.store.base import SEEN_KEYS_KEPT, BatchRow, GroupRow, NewGroup, Snapshot


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
