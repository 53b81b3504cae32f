"""A new user's first hour, scripted: the README's and docs' commands as written, run as real
processes from a fresh environment directory, each within its time and with a useful result.

The environment file is the one docs/environments.md shows (read from the doc, so the doc is
what is tested); the local server is the one the doc starts (`atropos local serve tiny`), on a
free port instead of the default, named with `--openai.base_url` as the doc says to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.testing import free_port

from .walk import background

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "environments.md"
pytestmark = pytest.mark.slow


def atropos(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """`atropos ARGS` in `cwd`, as the user types it; fails the test past `timeout` seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "atropos", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    done.elapsed = time.monotonic() - started  # type: ignore[attr-defined]
    return done


def first_python_block(doc: Path) -> str:
    """The first ```python block of `doc`: the environment a new user copies."""
    found = re.search(r"```python\n(.*?)```", doc.read_text(), re.DOTALL)
    assert found, f"{doc} shows no python block"
    return found.group(1)


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`atropos local serve tiny` on a free port: its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("local") / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "atropos", "local", "serve", "tiny", "--port", str(port)]
    with background(argv, log, env=env, health=url):
        yield url + "/v1"


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    """A fresh folder holding only the doc's environment, saved as the doc says."""
    (tmp_path / "capitals.py").write_text(first_python_block(DOC))
    return tmp_path


def groups(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def test_bare_atropos_lists_the_commands(tmp_path):
    done = atropos(cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    for command in ("env", "api", "local", "train", "demo", "export", "view"):
        assert re.search(rf"^\s+{command}\b", done.stdout, re.MULTILINE), done.stdout


def test_the_docs_environment_runs_against_the_local_server(env_dir, local_server):
    done = atropos(
        "env", "process", "capitals.py", "--env.total_steps", "4",
        "--openai.base_url", local_server, cwd=env_dir, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert len(groups(env_dir / "data" / "capitals.jsonl")) == 4
    assert (env_dir / "data" / "capitals.html").exists()
    assert "wrote 4 groups" in done.stdout + done.stderr


@pytest.mark.parametrize("target", ["capitals.py:Capitals", "capitals:Capitals"])
def test_a_file_or_module_in_the_working_directory_is_an_environment(target, env_dir, local_server):
    done = atropos(
        "env", "process", target, "--env.total_steps", "1",
        "--openai.base_url", local_server, cwd=env_dir, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(groups(env_dir / "data" / "capitals.jsonl")) == 1


def test_no_server_running_says_how_to_start_one_and_stops(env_dir):
    done = atropos(
        "env", "process", "capitals.py", "--env.total_steps", "4", "--server_wait", "3",
        cwd=env_dir, timeout=60,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "atropos local serve tiny" in text  # the first line names the server and its command
    assert "no inference server was healthy for 3 s" in text, text[-3000:]
    assert "Traceback" not in text
    assert not (env_dir / "data" / "capitals.jsonl").exists()  # nothing made, no empty file


def test_a_wrong_model_name_stops_at_the_first_404(env_dir, local_server):
    done = atropos(
        "env", "process", "capitals.py", "--env.total_steps", "8",
        "--openai.base_url", local_server, "--openai.model_name", "no-such-model",
        "--env.tokenizer_name", "tiny", cwd=env_dir, timeout=60,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "--openai.model_name" in text
    assert text.count("HTTP 404") <= 2, text[-3000:]  # once, not once per item
    assert "Traceback" not in text


def test_common_mistakes_get_one_line_naming_the_fix(tmp_path):
    train = atropos("train", cwd=tmp_path, timeout=60)
    assert train.returncode == 2
    assert "--model is required" in train.stderr and "--model tiny" in train.stderr
    assert "errors.pydantic.dev" not in train.stderr and "Traceback" not in train.stderr

    api = atropos("api", "serve", "--prot", "8001", cwd=tmp_path, timeout=60)
    assert api.returncode == 2
    assert "did you mean --port?" in api.stderr

    unknown = atropos("env", "process", "capitols", cwd=tmp_path, timeout=60)
    assert unknown.returncode == 2
    assert "Traceback" not in unknown.stderr


def test_every_command_answers_within_its_time(tmp_path):
    """The help of each command a new user tries first comes back in seconds."""
    for args in (["env", "list"], ["train", "--help"], ["api", "serve", "--help"]):
        done = atropos(*args, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
        assert done.elapsed < 30, (args, done.elapsed)  # type: ignore[attr-defined]
