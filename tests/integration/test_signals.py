"""SIGINT and SIGTERM stop the env runners promptly in every state, as real processes: waiting
for an inference server that is not there, waiting to register (API down; API up with no
trainer), and mid-rollout against the fake inference server. Each must exit within a few
seconds with 130 (SIGINT) or 143 (SIGTERM), print its summary, and print no traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import FakeInferenceServer, free_port, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


@contextlib.contextmanager
def nothing() -> Iterator[dict[str, str]]:
    yield {
        "inference": f"http://127.0.0.1:{free_port()}/v1",
        "api": f"http://127.0.0.1:{free_port()}",
    }


@contextlib.contextmanager
def api_without_trainer() -> Iterator[dict[str, str]]:
    with serve_in_thread(create_app(ApiConfig())) as url:
        yield {"inference": f"http://127.0.0.1:{free_port()}/v1", "api": url}


@contextlib.contextmanager
def slow_server() -> Iterator[dict[str, str]]:
    with FakeInferenceServer(latency=30.0) as fake:
        yield {"inference": fake.base_url, "api": f"http://127.0.0.1:{free_port()}"}


CASES = {
    # name: (mode, where, the log line that says the state is reached, the summary)
    "process-no-server": ("process", nothing, "is unhealthy", "stopped by {sig}: wrote 0 groups"),
    "process-mid-rollout": ("process", slow_server, "metrics to", "stopped by {sig}: wrote 0"),
    "serve-api-down": ("serve", nothing, "waiting to register", "stopped by {sig} before"),
    "serve-no-trainer": ("serve", api_without_trainer, "no trainer", "stopped by {sig} before"),
    "evaluate-mid-rollout": ("evaluate", slow_server, "metrics to", "stopped by {sig}: the eval"),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_signal_stops_the_runner_promptly(case, sig, tmp_path):
    mode, where, reached, summary = CASES[case]
    with where() as urls:
        cmd = [
            sys.executable, str(ROOT / "tests/envs/addition_env.py"), mode,
            "--openai.base_url", urls["inference"], "--openai.server_type", "vllm",
            "--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny",
            "--env.rollout_server_url", urls["api"], "--env.use_wandb", "false",
            "--env.total_steps", "50", "--env.spool_dir", str(tmp_path / "spool"),
            "--env.data_path_to_save_groups", str(tmp_path / "out.jsonl"),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
        log = tmp_path / "stderr.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, env=env
            )
        try:
            end = time.monotonic() + 60
            while reached not in log.read_text():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < end, log.read_text()[-3000:]
                time.sleep(0.1)
            time.sleep(1.0)  # in that state for a while
            proc.send_signal(sig)
            sent = time.monotonic()
            code = proc.wait(timeout=15)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    text = log.read_text()
    assert code == EXIT[sig], text[-3000:]
    assert took < 10, text[
        -3000:
    ]  # a 1 s grace, then exit: ~3 s idle, up to ~9 s on a busy 2-core box
    assert summary.format(sig=sig.name) in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not (tmp_path / "out.jsonl").exists()  # nothing made: no empty file
