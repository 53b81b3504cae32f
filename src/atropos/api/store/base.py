"""What a store holds and what the API asks of it: the records and the `Store` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
