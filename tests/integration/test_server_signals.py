"""SIGINT and SIGTERM stop the servers and the trainer promptly, as real processes: the API
(idle and with a trainer registered), the local inference server, and `atropos train` while it
waits for the API, for its inference server and for a batch. Each must exit within seconds,
print no traceback, and leave no process behind (the runners' states: test_signals.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import FakeInferenceServer, free_port, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "atropos", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own group: a leftover child would show in killpg
        )


def wait_for(proc: subprocess.Popen[bytes], log: Path, ready: str, deadline: float = 60) -> None:
    """Wait until `ready` is in the log (a URL: it answers /health)."""
    end = time.monotonic() + deadline
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < end, f"not ready within {deadline} s: " + log.read_text()[-3000:]
        if ready.startswith("http"):
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(ready + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
        elif ready in log.read_text():
            return
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals, log: Path) -> float:
    """Send `sig`; the seconds until the process exited (it must, within 15 s)."""
    time.sleep(0.5)  # in that state for a moment
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    took = time.monotonic() - sent
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone
        os.killpg(proc.pid, 0)
        pytest.fail("a process of the group outlived it")
    return took


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_the_api_stops_promptly(sig, tmp_path):
    port = free_port()
    proc = start(
        ["api", "serve", "--port", str(port), "--run-dir", "runs"], tmp_path / "log", tmp_path
    )
    wait_for(proc, tmp_path / "log", f"http://127.0.0.1:{port}")
    assert stop(proc, sig, tmp_path / "log") < 8


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_the_local_server_stops_promptly(sig, tmp_path):
    port = free_port()
    proc = start(["local", "serve", "tiny", "--port", str(port)], tmp_path / "log", tmp_path)
    wait_for(proc, tmp_path / "log", f"http://127.0.0.1:{port}")
    assert stop(proc, sig, tmp_path / "log") < 8


@contextlib.contextmanager
def no_api() -> Iterator[tuple[str, str]]:
    yield f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}/v1"


@contextlib.contextmanager
def api_and_server() -> Iterator[tuple[str, str]]:
    with serve_in_thread(create_app(ApiConfig())) as api, FakeInferenceServer() as fake:
        yield api, fake.base_url


TRAINER_STATES = {
    # name: (what runs, the log line that says the trainer waits, what it waits for)
    "api-down": (no_api, "retrying", "the API"),
    "no-batch": (api_and_server, "registered with", "a batch"),
}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("state", list(TRAINER_STATES))
def test_the_trainer_stops_promptly_while_it_waits(state, sig, tmp_path):
    where, reached, what = TRAINER_STATES[state]
    with where() as (api, server):
        args = [
            "train", "--model", "tiny", "--api-url", api, "--server-url", server,
            "--sync", "none", "--out-dir", str(tmp_path / "out"), "--steps", "3",
        ]  # fmt: skip
        proc = start(args, tmp_path / "log", tmp_path)
        wait_for(proc, tmp_path / "log", reached)
        took = stop(proc, sig, tmp_path / "log")
    assert took < 8, (tmp_path / "log").read_text()[-3000:]
    text = (tmp_path / "log").read_text()
    assert f"while waiting for {what}" in text, text[-3000:]
