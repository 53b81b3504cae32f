"""Fixtures of the interop tests: the python of `.cache/interop-venv` (`make interop`), which
holds the official packages of the protocols (openreward, openenv-core)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atropos.interop.openenv.launch import INTEROP_PYTHON

INTEROP_VENV = INTEROP_PYTHON.parents[1]

# Programs run by the interop venv's python (they import openreward or openenv), never collected
# here: environments written with the official packages (`*_envs/`) and their clients
# (`clients/`).
collect_ignore_glob = ["*_envs/*", "clients/*"]


@pytest.fixture(scope="session")
def interop_python() -> Path:
    """The interop venv's python; the tests fail, naming `make interop`, when it is absent."""
    python = INTEROP_PYTHON
    if not (INTEROP_VENV / ".installed").is_file() or not python.exists():
        pytest.fail(
            f"{INTEROP_VENV} is missing: `make interop` makes it (openreward and openenv-core,"
            " the protocols' official packages, on python3.11)"
        )
    return python
