"""SIGKILL of the owner: bwrap's trees die with it, and `sweep()` at the next start removes
the rest (process-provider background processes, folders, uid reservations)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.sandbox.conftest import leftovers

from atropos.sandbox import _host, sweep

OWNER = """
import asyncio, sys
from atropos.sandbox import SandboxSpec, open_sandbox

async def main():
    boxes = [await open_sandbox(SandboxSpec(), p) for p in ("bubblewrap", "process", "process")]
    for box in boxes[1:]:
        await box.exec("setsid sh -c \\"trap '' TERM; sleep 1000\\" >/dev/null 2>&1 &", timeout=5)
    running = [asyncio.ensure_future(box.exec("sleep 1000", timeout=1000)) for box in boxes]
    await asyncio.sleep(0.5)
    print(" ".join(str(box.uid) for box in boxes), flush=True)
    await asyncio.gather(*running)

asyncio.run(main())
"""


@pytest.mark.skipif(not _host.IS_ROOT, reason="sweeping by uid needs root")
def test_sigkill_of_the_owner_then_sweep_leaves_nothing(run_root: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, env={**os.environ}, text=True
    )
    assert owner.stdout is not None
    uids = [int(uid) for uid in owner.stdout.readline().split()]
    assert len(uids) == 3 and all(_host.tasks_of(uid) for uid in uids)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 5
    while _host.tasks_of(uids[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _host.tasks_of(uids[0]) == []  # bwrap: --die-with-parent
    assert len(list(run_root.glob("owner-*/*"))) == 3  # the labels are still there
    assert sweep(run_root) == 3
    assert leftovers(run_root, uids) == []
