"""SIGTERM to an owner holding sandboxes of every provider (bubblewrap, process, docker) in the
middle of their execs: under `run_owned` it exits at once with nothing left (no container, no
process of the sandboxes' uids, no folder or uid under the run root). Under a plain
`asyncio.run`, Python's default SIGTERM ends it without any cleanup, and `sweep()` is what
removes the rest: that is why owners use `run_owned` (or a runner that cancels on SIGTERM)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from atropos.sandbox import _host, sweep

OWNER = """
import asyncio, sys
from atropos.sandbox import SandboxSpec, open_sandbox, run_owned

async def main():
    async with (
        await open_sandbox(SandboxSpec(), "bubblewrap") as bwrap,
        await open_sandbox(SandboxSpec(), "process") as process,
        await open_sandbox(SandboxSpec(image={image!r}), "docker") as docker,
    ):
        await process.exec("setsid sh -c \\"trap '' TERM; sleep 1000\\" >/dev/null 2>&1 &", 5)
        boxes = (bwrap, process, docker)
        running = [box.exec("trap '' TERM; sleep 1000", timeout=1000) for box in boxes]
        print(bwrap.uid, process.uid, docker.name, flush=True)
        await asyncio.gather(*running)

{run}
"""
RUNS = {
    "run_owned": "sys.exit(run_owned(main))",
    "asyncio.run": "asyncio.run(main())",
}


def leftovers(root: Path, uids: list[int], engine: Any, name: str) -> list[str]:
    found = [str(p) for p in root.glob("owner-*/*")] + [str(p) for p in root.glob("uids/*")]
    found += [f"pid {pid} of uid {uid}" for uid in uids for pid in _host.tasks_of(uid)]
    found += [
        f"container {c}"
        for c in engine.docker(["ps", "-aq", "--filter", f"name={name}"]).stdout.split()
    ]
    return found


@pytest.mark.skipif(not _host.IS_ROOT, reason="a uid per sandbox (and dockerd) need root")
@pytest.mark.parametrize("run", sorted(RUNS))
def test_sigterm_of_an_owner_mid_exec(
    run: str,
    docker_engine: Any,
    sandbox_image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # under /tmp itself: the sandboxes' uids must reach their work dirs (pytest's are 0700)
    root = Path(tempfile.mkdtemp(prefix="atropos-sbx-test-", dir="/tmp"))
    root.chmod(0o711)
    try:
        _sigterm_mid_exec(run, docker_engine, sandbox_image, root, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sigterm_mid_exec(
    run: str, docker_engine: Any, sandbox_image: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    script = OWNER.format(image=sandbox_image, run=RUNS[run])
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert owner.stdout is not None
        bwrap_uid, process_uid, name = owner.stdout.readline().split()
        uids = [int(bwrap_uid), int(process_uid)]
        time.sleep(0.5)  # the three execs run
        assert all(_host.tasks_of(uid) for uid in uids)
        began = time.monotonic()
        owner.send_signal(signal.SIGTERM)
        status = owner.wait(timeout=60)
        took = time.monotonic() - began
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    if run == "run_owned":
        assert status == 143
        assert took < 10, took  # three closes, the container's removal the longest
        assert leftovers(root, uids, docker_engine, name) == []
    else:
        assert status == -signal.SIGTERM  # Python's default: gone, nothing closed
        assert leftovers(root, uids, docker_engine, name)  # the container, the folders
        assert sweep(root) == 3  # two local sandboxes, one container
        assert leftovers(root, uids, docker_engine, name) == []
