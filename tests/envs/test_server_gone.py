"""Servers gone for good stop the run: `atropos env serve|process|evaluate` as real processes,
with a fake inference server (its own process) that answers, then is killed (SIGKILL, as a dead
engine). Once every server of the role (the policy's, the teacher's, the judge's) has been
unreachable for `--server_wait` seconds, the env exits 1 with one line naming the role, the URL
and how long, and no traceback; a server back in time changes nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.testing import free_port, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
ENVS = Path(__file__).with_name("outage_env.py")
SERVER_WAIT = 3  # seconds: the deadline under test
MARGIN = 45  # seconds the stop may take past it on a loaded machine
pytestmark = pytest.mark.slow


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"{what} did not happen within {seconds} s"
        time.sleep(0.1)


class FakeServer:
    """`python -m atropos.testing.fake_server` on a fixed loopback port, as its own process."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.log = folder / f"fake-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeServer:
        command = [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(self.port)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        wait_until(self._answers, 60, "the fake server's /health")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL by pid: nothing answers on the port any more."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


class EnvRun:
    """`atropos env MODE outage_env.py:CLASS FLAGS` in `folder`, output to files."""

    def __init__(
        self, folder: Path, mode: str, cls: str, *flags: str, server_wait: float = SERVER_WAIT
    ) -> None:
        self.folder = folder
        self.marks = folder / "marks"
        self.stop = folder / "stop"
        self.err = folder / f"{mode}.err"
        command = [sys.executable, "-m", "atropos", "env", mode, f"{ENVS}:{cls}"]
        command += ["--env.tokenizer_name", "tiny", "--env.use_wandb", "false"]
        command += ["--server_wait", f"{server_wait:g}", "--health_check_interval", "0.2"]
        if mode != "evaluate":
            command += ["--env.total_steps", "1000000", "--env.max_num_workers", "4"]
            command += ["--env.data_path_to_save_groups", str(folder / "groups.jsonl")]
        environ = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "OUTAGE_MARKS": str(self.marks),
            "OUTAGE_STOP": str(self.stop),
        }
        with open(folder / f"{mode}.out", "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [*command, *flags], cwd=folder, env=environ, stdout=out, stderr=err
            )

    def answered(self, role: str, times: int = 1) -> int:
        """How many times `role`'s servers answered (waiting for `times`)."""

        def enough() -> bool:
            assert self.proc.poll() is None, self.stderr()[-3000:]
            return self.count(role) >= times

        wait_until(enough, 120, f"{times} answer(s) from the {role}'s server")
        return self.count(role)

    def count(self, role: str) -> int:
        lines = self.marks.read_text().splitlines() if self.marks.exists() else []
        return lines.count(role)

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self, seconds: float) -> int:
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            text = self.stderr()[-3000:]
            raise AssertionError(f"the env still ran after {seconds} s:\n{text}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def api() -> Iterator[str]:
    """A trajectory API with a trainer registered whose batches leave room for many groups."""
    registration = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": 1024, "max_token_len": 64,
        "checkpoint_dir": "", "save_checkpoint_interval": 0, "starting_step": 0,
        "num_steps": 1000,
    }  # fmt: skip
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as c:
        c.post("/register", json=registration)
        c.get("/batch")  # started; nothing drains the queue
        yield url


def stops_with_one_line(run: EnvRun, server: FakeServer, role: str, waited_for: str) -> None:
    """Kill `server` once `role` answered; the run must exit 1 with the one line."""
    run.answered(waited_for)
    server.kill()
    killed = time.monotonic()
    status = run.wait(SERVER_WAIT + MARGIN)
    took = time.monotonic() - killed
    text = run.stderr()
    assert status == 1, text[-3000:]
    line = f"the {role}'s inference server ({server.base_url}) has been unreachable for"
    found = [row for row in text.splitlines() if line in row]
    assert len(found) == 1, text[-3000:]
    assert re.search(r"unreachable for \d+ s \(.*Connection.*\); start it again", found[0])
    assert "raise --server_wait (now 3 s)" in found[0]
    assert "Traceback" not in text, text[-3000:]
    assert SERVER_WAIT <= took < SERVER_WAIT + MARGIN  # it waited out the deadline, no more


@pytest.mark.parametrize("mode", ["process", "serve", "evaluate"])
def test_the_run_stops_when_the_policys_servers_are_gone(mode, tmp_path, fake_server, api):
    flags = ["--openai.base_url", fake_server.base_url, "--openai.model_name", "atropos-tiny"]
    if mode == "serve":
        flags += ["--env.rollout_server_url", api]
    run = EnvRun(tmp_path, mode, "PolicyOutage", *flags)
    try:
        stops_with_one_line(run, fake_server, "policy", "policy")
    finally:
        run.kill()


def test_the_run_stops_when_the_teachers_servers_are_gone(tmp_path, fake_server):
    flags = ["--testing", "--teacher.base_url", fake_server.base_url]
    flags += ["--teacher.model_name", "atropos-tiny", "--teacher.tokenizer_name", "tiny"]
    run = EnvRun(tmp_path, "process", "PolicyOutage", *flags)
    groups = tmp_path / "groups.jsonl"
    try:
        # a group written has its teacher logprobs: the teacher answered
        wait_until(lambda: groups.exists() and groups.stat().st_size > 0, 120, "a group")
        stops_with_one_line(run, fake_server, "teacher", "policy")
    finally:
        run.kill()
    assert "teacher: the teacher's inference server" in run.stderr()


def test_the_evaluation_stops_when_the_judges_servers_are_gone(tmp_path, fake_server):
    flags = ["--testing", "--judge.base_url", fake_server.base_url]
    flags += ["--judge.model_name", "atropos-tiny"]
    run = EnvRun(tmp_path, "evaluate", "JudgedOutage", *flags)
    try:
        stops_with_one_line(run, fake_server, "judge", "judge")
    finally:
        run.kill()
    assert "judge: the judge's inference server" in run.stderr()


def test_a_server_back_before_the_deadline_changes_nothing(tmp_path, fake_server):
    """Killed and started again on its port (as `atropos launch` restarts a server): the calls
    wait through it, the run goes on, and ends on its own with status 0."""
    flags = ["--openai.base_url", fake_server.base_url, "--openai.model_name", "atropos-tiny"]
    # a deadline the restart stays well within, even on a loaded machine
    run = EnvRun(tmp_path, "process", "PolicyOutage", *flags, server_wait=60)
    try:
        run.answered("policy")
        fake_server.kill()
        wait_until(lambda: "is unhealthy" in run.stderr(), 60, "the env seeing the server down")
        before = run.count("policy")
        fake_server.start()
        run.answered("policy", before + 5)  # answers again after the restart
        run.stop.touch()  # no more items: the run ends on its own
        status = run.wait(60)
    finally:
        run.kill()
    text = run.stderr()
    assert status == 0, text[-3000:]
    assert "has been unreachable" not in text
    assert "Traceback" not in text, text[-3000:]
