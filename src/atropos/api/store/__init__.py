"""Durable storage behind the trajectory API: SQLite (default) and memory (tests, throwaway runs).

The API keeps its indexes in memory and writes every state change through a store before it
answers, so a 2xx means committed. Group bodies live only in the store; memory holds a few
numbers per group. Stores are chosen by a spec string: `sqlite:PATH` or `memory`.
"""

from __future__ import annotations

from atropos.api.store.base import BatchRow, GroupRow, NewGroup, Snapshot, Store
from atropos.api.store.memory import MemoryStore
from atropos.api.store.sqlite import SQLiteStore

__all__ = [
    "BatchRow",
    "GroupRow",
    "MemoryStore",
    "NewGroup",
    "SQLiteStore",
    "Snapshot",
    "Store",
    "open_store",
]


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
