"""A private run root per test (under /tmp: the sandboxes' uids must reach their work dirs)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.sandbox import _host


@pytest.fixture
def run_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="atropos-sbx-test-", dir="/tmp"))
    root.chmod(0o711)
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def leftovers(root: Path, uids: list[int] = ()) -> list[str]:  # type: ignore[assignment]
    """What is left under `root` (sandbox folders and uid reservations) and any process of
    `uids`."""
    found = [str(p) for p in root.glob("owner-*/*")]
    found += [str(p) for p in (root / "uids").glob("*")] if (root / "uids").exists() else []
    found += [f"pid {pid} of uid {uid}" for uid in uids for pid in _host.tasks_of(uid)]
    return found
