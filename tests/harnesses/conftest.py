"""Shared fixtures of the harness tests (helpers.py has the scripted policy and `collect`).

Every harness test runs a real harness in a real bubblewrap sandbox whose only network is the
environment's proxy, which calls a `FakeInferenceServer` on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.testing import FakeInferenceServer

CALC = b"def add(a, b):\n    return a - b\n"
TEST = "python3 -c 'from calc import add; assert add(2, 3) == 5'"


@pytest.fixture
def script_server() -> Iterator[Callable[[Any], FakeInferenceServer]]:
    """`script_server(script)`: a started fake server answering with `script`."""
    servers: list[FakeInferenceServer] = []

    def start(script: Any) -> FakeInferenceServer:
        server = FakeInferenceServer(responder=script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def calc_tasks(tmp_path: Path) -> Path:
    """A JSONL with one task: fix `add` in calc.py (a folder snapshot); its test imports it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_bytes(CALC)
    row = {"id": "calc", "instruction": "Fix add() in calc.py.", "snapshot": "repo", "test": TEST}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    return tasks


@pytest.fixture(autouse=True)
def sandbox_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A run root of the test's own for sandboxes (other test runs sweep the shared one);
    under /tmp, which the sandboxes' uids may traverse (pytest's tmp_path is 0700). Nothing
    may be left in it after a test."""
    if shutil.which("bwrap") is None:
        pytest.fail("bwrap is missing: make bubblewrap (apt-get install -y bubblewrap)")
    root = Path(tempfile.mkdtemp(prefix="atropos-harness-tests-", dir="/tmp"))
    root.chmod(0o711)
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(root))
    yield root
    left = [str(p) for p in root.glob("owner-*/*")] + [str(p) for p in root.glob("uids/*")]
    shutil.rmtree(root, ignore_errors=True)
    assert left == []  # every sandbox closed, every uid freed
