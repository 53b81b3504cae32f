"""The whole loop as real processes on loopback: inference server, trajectory API, an env in
serve mode, and a trainer client; the API is killed (SIGKILL) and restarted mid-run.

Nothing may be lost or duplicated: every group the env wrote to its JSONL record reaches the
trainer exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from atropos.demo import wait_until_up
from atropos.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

REGISTRATION = {
    "wandb_group": "it",
    "wandb_project": "it",
    "batch_size": 8,
    "max_token_len": 4096,
    "checkpoint_dir": "",
    "save_checkpoint_interval": 0,
    "starting_step": 0,
    "num_steps": 100_000,
}


class LeasingTrainer(threading.Thread):
    """Pulls leased batches and acknowledges them; registers again after an API restart."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.groups: dict[str, dict] = {}
        self.seen_batches: set[str] = set()
        self.duplicates = 0
        self.stop = threading.Event()
        self.outages = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as c:
            c.post("/register", json=REGISTRATION)
            lost = False
            while not self.stop.is_set():
                try:
                    if lost:
                        c.post("/register", json=REGISTRATION)  # leases come back at once
                        lost = False
                    reply = c.get("/batch", params={"lease": 60}).json()
                    if reply["batch"] is None:
                        time.sleep(0.05)
                        continue
                    if reply["batch_id"] not in self.seen_batches:
                        self.seen_batches.add(reply["batch_id"])
                        for g in reply["batch"]:
                            if g["group_id"] in self.groups:
                                self.duplicates += 1
                            self.groups[g["group_id"]] = g
                    c.post("/batch/ack", json={"batch_id": reply["batch_id"]})
                except httpx.TransportError:
                    if not lost:
                        self.outages += 1
                    lost = True
                    time.sleep(0.1)


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}  # this checkout
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=15)


def test_serve_loop_survives_an_api_crash(tmp_path):
    fake_port, api_port = free_port(), free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    py = sys.executable
    fake_cmd = [
        py,
        "-m",
        "atropos.testing.fake_server",
        "--port",
        str(fake_port),
        "--latency",
        "0.05",
        "--responder",
        "tests.envs.arith:solver",
    ]
    api_cmd = [
        py,
        "-m",
        "atropos",
        "api",
        "serve",
        "--port",
        str(api_port),
        "--store",
        f"sqlite:{tmp_path / 'api.db'}",
    ]
    record = tmp_path / "sent.jsonl"
    env_cmd = [
        py, "tests/envs/addition_env.py", "serve",
        "--openai.base_url", f"http://127.0.0.1:{fake_port}/v1",
        "--openai.server_type", "vllm", "--openai.model_name", "atropos-tiny",
        "--env.tokenizer_name", "tiny", "--env.rollout_server_url", api_url,
        "--env.group_size", "4", "--env.max_num_workers", "8", "--env.use_wandb", "false",
        "--env.ensure_scores_are_not_same", "false", "--env.total_steps", "100000",
        "--env.data_path_to_save_groups", str(record), "--env.spool_dir", str(tmp_path / "spool"),
        "--env.steps_per_eval", "0",
    ]  # fmt: skip
    procs: list[subprocess.Popen] = []
    trainer = None
    try:
        procs.append(start(fake_cmd, tmp_path / "fake.log"))
        api = start(api_cmd, tmp_path / "api.log")
        procs.append(api)
        wait_until_up(f"http://127.0.0.1:{fake_port}/health", 30)
        wait_until_up(f"{api_url}/health", 30)
        trainer = LeasingTrainer(api_url)
        trainer.start()
        env = start(env_cmd, tmp_path / "env.log")
        procs.append(env)

        def wait_for(n: int, deadline: float = 60) -> None:
            end = time.monotonic() + deadline
            while len(trainer.groups) < n:
                assert time.monotonic() < end, (tmp_path / "env.log").read_text()[-3000:]
                assert env.poll() is None, (tmp_path / "env.log").read_text()[-3000:]
                time.sleep(0.1)

        wait_for(20)
        os.kill(api.pid, signal.SIGKILL)  # the API dies mid-run
        api.wait(timeout=10)
        time.sleep(2.0)  # the env keeps rolling out and spools what it cannot send
        api = start(api_cmd, tmp_path / "api2.log")
        procs.append(api)
        wait_until_up(f"{api_url}/health", 30)
        wait_for(len(trainer.groups) + 20)
        env.send_signal(signal.SIGTERM)  # graceful: finish in-flight rollouts, flush, exit 143
        assert env.wait(timeout=60) == 143, (tmp_path / "env.log").read_text()[-3000:]
        with httpx.Client(base_url=api_url) as c:  # wait until the trainer has it all
            end = time.monotonic() + 30
            while c.get("/status").json()["queue_size"] >= 2 and time.monotonic() < end:
                time.sleep(0.1)
        trainer.stop.set()
        trainer.join(10)
        with httpx.Client(base_url=api_url) as c:  # one group per batch: drain the remainder
            c.post("/register", json={**REGISTRATION, "batch_size": 4})
            while (batch := c.get("/batch").json()["batch"]) is not None:
                for g in batch:
                    assert g["group_id"] not in trainer.groups
                    trainer.groups[g["group_id"]] = g
    finally:
        if trainer is not None:
            trainer.stop.set()
        for p in procs:
            stop(p)

    sent = [json.loads(line) for line in record.read_text().splitlines()]
    sent_ids = [g["group_id"] for g in sent]
    assert len(sent_ids) == len(set(sent_ids)) > 40
    assert trainer.outages >= 1
    assert trainer.duplicates == 0
    assert set(trainer.groups) == set(sent_ids)  # every group once: none lost, none twice
    got = trainer.groups[sent_ids[0]]
    assert got["token_source"] == "server" and len(got["inference_logprobs"]) == 4
    assert "spool" in (tmp_path / "env.log").read_text()  # the outage really was ridden out
