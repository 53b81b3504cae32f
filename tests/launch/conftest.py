"""Fixtures of the launch tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .runs import Launch, kill_leftovers


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """Launches a test started; whatever is left of them is killed afterwards."""
    started: list[Launch] = []
    yield started
    for launch in started:
        kill_leftovers(launch)
