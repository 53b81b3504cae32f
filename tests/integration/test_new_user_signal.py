"""A new user's first runs, as real processes, checked line by line for noise and for signal.

No traceback and no resolved-configuration dump without `--verbose` (one line names the file),
`evaluate`'s metrics printed once, a misspelt reasoning-gym task as one line with exit 2, and a
first environment whose every group is dropped for equal scores: the env says what to do, and
the API still shows the drops after the env has gone.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.envs.runner.watch import IDENTICAL_SCORES_HINT
from atropos.testing import free_port

from .test_new_user import DOC, atropos, first_python_block
from .walk import background

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

NEVER = '''from atropos.envs import Env


class Never(Env):
    """Pass/fail scoring on a policy that always fails: every group's scores are equal."""

    name = "never"

    def load(self):
        return [{"question": "Capital of France?", "answer": "Paris"}]

    def load_eval(self):
        return self.load()

    def score(self, item, completion):
        return 0.0
'''


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    (tmp_path / "capitals.py").write_text(first_python_block(DOC))
    (tmp_path / "never.py").write_text(NEVER)
    return tmp_path


def quiet(text: str) -> None:
    """No traceback and no dump of the resolved configuration."""
    assert "Traceback" not in text, text[-3000:]
    assert "mode: " not in text and "group_size:" not in text, text[-3000:]


def test_process_names_its_config_file_and_prints_no_dump(env_dir):
    done = atropos(
        "env", "process", "capitals.py", "--env.total_steps", "2", "--testing",
        cwd=env_dir, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    quiet(done.stdout + done.stderr)
    assert "configuration: data/capitals.config.yaml (--verbose prints it)" in done.stderr
    assert (env_dir / "data" / "capitals.config.yaml").is_file()
    verbose = atropos(
        "env", "process", "capitals.py", "--env.total_steps", "1", "--testing", "--verbose",
        cwd=env_dir, timeout=120,
    )  # fmt: skip
    assert verbose.returncode == 0 and "mode: process" in verbose.stderr
    assert (env_dir / "data" / "capitals_1.jsonl").is_file()  # a rerun never overwrites


def test_evaluate_prints_its_metrics_once(env_dir):
    done = atropos("env", "evaluate", "never.py", "--testing", cwd=env_dir, timeout=120)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    quiet(text)
    metrics = [line for line in text.splitlines() if "'eval/" in line]
    assert len(metrics) == 1, text[-3000:]
    assert text.rstrip().endswith("evaluated: metrics above, in runs/never/metrics.jsonl")


def test_a_misspelt_reasoning_gym_task_is_one_line_and_exit_2(tmp_path):
    pytest.importorskip("reasoning_gym")
    done = atropos(
        "env", "process", "reasoning_gym", "--env.tasks", "no_such_task", "--testing",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "atropos env process reasoning_gym: error: --env.tasks: reasoning-gym has no task"
        " 'no_such_task'"
    )


def test_process_says_what_to_do_when_every_group_is_dropped(env_dir):
    done = atropos(
        "env", "process", "never.py", "--env.total_steps", "4", "--testing",
        "--env.ensure_scores_are_not_same", "true", cwd=env_dir, timeout=120,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    quiet(text)
    assert text.count(IDENTICAL_SCORES_HINT) == 1, text[-3000:]


# ----- serve: the hint, and the drops kept by the API after the env disconnects ----------------

REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 16,
    "max_token_len": 2048,
    "checkpoint_dir": "",
    "save_checkpoint_interval": -1,
    "starting_step": 0,
    "num_steps": 100,
}


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    """`atropos api serve` (memory store) with a trainer registered, as `atropos train` does."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("ATROPOS_API_KEY", None)
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "atropos", "api", "serve", "--port", str(port)]
    log = tmp_path / "api.log"
    with background([*argv, "--store", "memory"], log, env=env, cwd=tmp_path, health=url):
        http("POST", url + "/register", REGISTRATION)
        http("GET", url + "/batch")  # the trainer has started
        yield url


def test_serve_says_what_to_do_and_the_api_keeps_the_drops(env_dir, api):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    env.pop("ATROPOS_API_KEY", None)
    log = env_dir / "serve.log"
    argv = [sys.executable, "-m", "atropos", "env", "serve", "never.py", "--testing"]
    argv += ["--env.rollout_server_url", api, "--env.use_wandb", "false"]
    with background(argv, log, env=env, cwd=env_dir, grace=60) as proc:
        end = time.monotonic() + 90
        while IDENTICAL_SCORES_HINT not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < end, log.read_text()[-3000:]
            time.sleep(0.5)
    text = log.read_text()
    assert proc.returncode == 143, text[-3000:]
    quiet(text)
    assert "dropped 100% of groups" in text
    stats = http("GET", api + "/stats")
    assert stats["env_dropped"]["identical_scores"] > 0  # the env has gone, its drops stay
    (entry,) = stats["envs"].values()
    assert entry["connected"] is False and entry["env_dropped"]["identical_scores"] > 0


def test_a_misspelt_reasoning_gym_setting_is_one_line_and_exit_2(tmp_path):
    pytest.importorskip("reasoning_gym")
    config = tmp_path / "rg.yaml"
    config.write_text("env:\n  tasks:\n  - name: leg_counting\n    config: {max_legs: 3}\n")
    done = atropos(
        "env", "process", "reasoning_gym", "--config", str(config), "--testing",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "reasoning-gym task 'leg_counting' has no setting 'max_legs'" in line, line
