"""What the new-user walk's tests share: a command of ours run in the background as a real
process, ready once its `/health` answers, and stopped as a user stops it (SIGTERM, then
SIGKILL past a grace period)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, within: float) -> None:
    """Until `url/health` answers 200; fails the test if `proc` ends or `within` s pass."""
    end = time.monotonic() + within
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < end, f"{url}/health did not answer within {within:g} s"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if `proc` is still there after `grace` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def background(
    argv: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    health: str | None = None,
    within: float = 60.0,
    grace: float = 10.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` running with its output in `log`; with `health` (a base URL), ready once its
    `/health` answers; stopped (`stop`) when the block ends."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        if health is not None:
            wait_healthy(health, proc, log, within)
        yield proc
    finally:
        stop(proc, grace)
