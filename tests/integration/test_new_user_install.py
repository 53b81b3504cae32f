"""A new user's install, scripted: docs/evals.md's first example as written, in the virtualenv
that `make demo` and `make extras` make (activated: its `bin` first on PATH), and the next step
`atropos env new` prints, which names the interpreter that runs it.

The example is read from the doc, so the doc is what is tested. Its local server runs on a
free port instead of the default (tests share the machine), named with `--openai.base_url`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.testing import free_port

from .walk import background

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "evals.md"
BIN = Path(os.path.abspath(sys.executable)).parent  # the virtualenv's programs


def activated(**extra: str) -> dict[str, str]:
    """The environment of a shell with this virtualenv activated (its bin first on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATROPOS_", "PYTEST_"))}
    path = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return {**env, "PATH": path, "VIRTUAL_ENV": sys.prefix, "PYTHONUNBUFFERED": "1", **extra}


def first_example(doc: Path) -> list[list[str]]:
    """The commands of the doc's first ```bash block up to its first blank line, each split
    as a shell would, comments and a trailing `&` dropped."""
    found = re.search(r"```bash\n(.*?)```", doc.read_text(), re.DOTALL)
    assert found, f"{doc} shows no bash block"
    example = found.group(1).split("\n\n")[0]
    return [shlex.split(line, comments=True) for line in example.splitlines() if line.strip()]


def argv(words: list[str]) -> list[str]:
    """`words` as the activated shell runs them: `atropos` is the virtualenv's script."""
    words = [w for w in words if w != "&"]
    assert words[0] == "atropos", words
    script = BIN / "atropos"
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "atropos"]
    return head + words[1:]


@pytest.fixture(scope="module")
def commands() -> list[list[str]]:
    found = [c for c in first_example(DOC) if c]
    assert [c[:3] for c in found] == [
        ["atropos", "local", "serve"],
        ["atropos", "env", "evaluate"],
    ], found
    return found


@pytest.fixture(scope="module")
def local_server(commands, tmp_path_factory) -> Iterator[str]:
    """The doc's `atropos local serve ...` on a free port: its base URL."""
    port = free_port()
    folder = tmp_path_factory.mktemp("local")
    url = f"http://127.0.0.1:{port}"
    argv_ = [*argv(commands[0]), "--port", str(port)]
    with background(argv_, folder / "serve.log", env=activated(), cwd=folder, health=url):
        yield url + "/v1"


@pytest.mark.slow
def test_the_first_evals_example_runs_as_written(commands, local_server, tmp_path):
    evaluate = [*argv(commands[1]), "--openai.base_url", local_server]
    done = subprocess.run(
        evaluate, cwd=tmp_path, env=activated(), capture_output=True, text=True, timeout=180
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "Traceback" not in text
    out = tmp_path / commands[1][commands[1].index("--env.data_dir_to_save_evals") + 1]
    assert (out / "metrics.json").is_file() and (out / "samples.jsonl").is_file(), text[-3000:]


def next_line(cwd: Path, env: dict[str, str]) -> str:
    """The `next:` line of `python -m atropos env new my-env` run in `cwd`."""
    done = subprocess.run(
        [sys.executable, "-m", "atropos", "env", "new", "my-env"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("next: ")]
    return line


@pytest.mark.slow
def test_env_new_names_the_interpreter_that_ran_it(tmp_path):
    """Not activated: the interpreter's full path; activated: `python`, which is it."""
    plain = activated(PATH=os.defpath)  # a shell whose `python` is not this virtualenv's
    python = shlex.quote(sys.executable)
    (tmp_path / "plain").mkdir()
    assert next_line(tmp_path / "plain", plain) == (
        f"next: cd my-env && {python} -m pip install -e '.[test]' && {python} -m pytest"
    )
    if not (BIN / "python").exists():
        return  # no `python` beside the interpreter: activation does not name it so
    (tmp_path / "active").mkdir()
    active = activated()
    assert next_line(tmp_path / "active", active) == (
        "next: cd my-env && python -m pip install -e '.[test]' && python -m pytest"
    )
    # and that `python` is the interpreter that wrote it
    which = subprocess.run(
        ["python", "-c", "import sys; print(sys.executable)"],
        env=active, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert Path(which.stdout.strip()).parent == BIN


def test_make_extras_covers_every_built_in_environment():
    """Each extra a built-in environment declares is in `make extras`, or left out with its
    reason in the Makefile and the README's table."""
    from atropos.envs import registry

    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"^ENV_EXTRAS := (\S+)$", makefile, re.MULTILINE)
    tested = re.search(r"^EXTRAS := (\S+)$", makefile, re.MULTILINE)
    assert extras and tested
    chosen = set(extras.group(1).split(","))
    assert chosen <= set(tested.group(1).split(",")), "make extras installs only locked extras"
    left_out = {"verifiers"}  # pins openai < 3, which the agents extra cannot share
    needed = {}
    for name, spec in registry.specs().items():
        if spec.origin == registry.BUILT_IN:
            for extra in registry.requirements(registry.get(name)).values():
                needed.setdefault(extra, name)
    missing = {e: n for e, n in needed.items() if e not in chosen | left_out}
    assert not missing, f"environments whose extra `make extras` leaves out: {missing}"
    readme = (ROOT / "README.md").read_text()
    for extra in chosen:
        assert re.search(rf"^\| `{re.escape(extra)}` .*\| yes", readme, re.MULTILINE), extra
    for extra in left_out:
        assert re.search(rf"^\| `{re.escape(extra)}` .*\| no: ", readme, re.MULTILINE), extra
