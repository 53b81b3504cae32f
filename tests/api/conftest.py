"""Shared helpers for API tests: groups, registrations, hubs over both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.api.hub import Hub, HubConfig
from atropos.api.store import MemoryStore, SQLiteStore, Store
from atropos.testing import serve_in_thread
from atropos.wire import Group, RegisterEnv, Registration


def make_group(size: int = 2, env_id: int | None = None, tag: int = 0, **extra) -> Group:
    """A valid group of `size` sequences; `tag` is written into the first token of each row."""
    return Group(
        tokens=[[tag, 1, 2] for _ in range(size)],
        masks=[[-100, 1, 2] for _ in range(size)],
        scores=[float(i % 2) for i in range(size)],
        env_id=env_id,
        **extra,
    )


def group_json(size: int = 2, tag: int = 0, **extra) -> dict:
    return {
        "tokens": [[tag, 1, 2]] * size,
        "masks": [[-100, 1, 2]] * size,
        "scores": [0.5] * size,
        **extra,
    }


def registration(batch_size: int = 8, starting_step: int = 0) -> Registration:
    return Registration("g", "p", batch_size, 2048, "ckpt", 10, starting_step, 100)


def registration_json(batch_size: int = 8, starting_step: int = 0) -> dict:
    return {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": batch_size,
        "max_token_len": 2048,
        "checkpoint_dir": "ckpt",
        "save_checkpoint_interval": 10,
        "starting_step": starting_step,
        "num_steps": 100,
    }


def env_request(name: str = "env", group_size: int = 2, **kw) -> RegisterEnv:
    kw.setdefault("weight", 1.0)
    return RegisterEnv(max_token_length=2048, desired_name=name, group_size=group_size, **kw)


class Clock:
    """A settable clock for lease and liveness tests."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["memory", "sqlite"])
def store_factory(request, tmp_path: Path) -> Iterator:
    """Makes stores of one kind; a sqlite factory reopens the same file (a restart)."""
    opened: list[Store] = []

    def make() -> Store:
        store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "api.db")
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def hub(store_factory, clock) -> Hub:
    return Hub(store_factory(), HubConfig(env_timeout=60.0), clock=clock)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """A client of an API served on 127.0.0.1 whose trainer has registered (batch 4) and asked
    for its first batch, so envs may register. A module wanting a bare API defines its own."""
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as c:
        c.post("/register", json=registration_json(4))
        c.get("/batch")  # the trainer is there: envs may register
        yield c
