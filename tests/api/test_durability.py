"""Crash tests: a real API process killed with SIGKILL and restarted on the same store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from atropos.demo import wait_until_up
from atropos.testing import free_port

from .conftest import group_json, registration_json


@contextmanager
def api_process(store: Path, port: int) -> Iterator[subprocess.Popen]:
    cmd = [
        sys.executable,
        "-m",
        "atropos",
        "api",
        "serve",
        "--port",
        str(port),
        "--store",
        f"sqlite:{store}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", deadline=30)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_everything_is_back_after_sigkill(tmp_path):
    store, port = tmp_path / "api.db", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "max_token_length": 64,
        "desired_name": "gsm8k",
        "weight": 2.0,
        "group_size": 2,
        "env_key": "host-a",
    }
    with api_process(store, port) as proc, httpx.Client(base_url=url) as c:
        c.post("/register", json=registration_json(4, starting_step=10))
        c.get("/batch")
        env_id = c.post("/register-env", json=env).json()["env_id"]
        for t in range(6):
            c.post("/scored_data", json=group_json(2, tag=t, env_id=env_id, group_id=f"g{t}"))
        assert [g["tokens"][0][0] for g in c.get("/batch").json()["batch"]] == [0, 1]
        leased = c.get("/batch", params={"lease": 300}).json()
        before = {k: c.get(k).json() for k in ("/info", "/wandb_info", "/status")}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    with api_process(store, port), httpx.Client(base_url=url) as c:
        assert {k: c.get(k).json() for k in ("/info", "/wandb_info", "/status")} == before
        assert before["/status"] == {"current_step": 12, "queue_size": 4}
        again = c.post("/register-env", json=env).json()
        assert (again["env_id"], again["wandb_name"]) == (env_id, "gsm8k_0")
        assert c.post("/scored_data", json=group_json(2, tag=3, group_id="g3")).json() == {
            "status": "received",
            "duplicate": True,
        }
        c.post("/register", json=registration_json(4, starting_step=0))  # trainer restarted
        replay = c.get("/batch", params={"lease": 300}).json()
        assert replay["batch_id"] == leased["batch_id"] and replay["batch"] == leased["batch"]
        c.post("/batch/ack", json={"batch_id": replay["batch_id"]})
        assert [g["tokens"][0][0] for g in c.get("/batch").json()["batch"]] == [4, 5]
        assert c.get("/status").json() == {"current_step": 13, "queue_size": 0}


@pytest.mark.slow
def test_every_acknowledged_post_survives_a_kill_mid_stream(tmp_path):
    store, port = tmp_path / "api.db", free_port()
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[int] = []
    with api_process(store, port) as proc:
        with httpx.Client(base_url=url) as c:
            c.post("/register", json=registration_json(64))

        def post_forever() -> None:
            with httpx.Client(base_url=url, timeout=5) as c:
                for t in range(100_000):
                    try:
                        r = c.post("/scored_data", json=group_json(8, tag=t, group_id=str(t)))
                    except httpx.TransportError:
                        return
                    if r.status_code == 200:
                        acknowledged.append(t)

        writer = threading.Thread(target=post_forever)
        writer.start()
        while len(acknowledged) < 300:
            if not writer.is_alive():
                break
            threading.Event().wait(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        writer.join(timeout=30)
    assert len(acknowledged) >= 300
    with api_process(store, port), httpx.Client(base_url=url) as c:
        queued = c.get("/status").json()["queue_size"]
        assert len(acknowledged) <= queued <= len(acknowledged) + 1  # one may be in flight
        c.post("/register", json=registration_json(8))  # one group per batch: drain them all
        seen: list[int] = []
        while (batch := c.get("/batch").json()["batch"]) is not None:
            seen += [g["tokens"][0][0] for g in batch]
        assert set(acknowledged) <= set(seen) and len(seen) == len(set(seen))
