"""`atropos env new NAME`: the package it writes, the names and folders it refuses, and the
package installed into a throwaway virtualenv, where its own tests pass and `atropos env list`
shows it with its origin."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

import atropos
from atropos.cli.main import main as atropos_main
from atropos.envs.scaffold import ScaffoldError, package_names, write_package
from atropos.install import atropos_command, python_command

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FILES = [
    "pyproject.toml",
    "README.md",
    "my_env/__init__.py",
    "my_env/env.py",
    "my_env/data/train.jsonl",
    "tests/test_env.py",
]


def test_env_new_writes_the_package(tmp_path, capsys):
    assert atropos_main(["env", "new", "my-env", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "my-env"
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == sorted(
        FILES
    )
    out = capsys.readouterr().out
    assert f"wrote the environment package {root}:" in out and "  my_env/env.py" in out
    python = python_command()
    assert f"next: cd {root} && {python} -m pip install -e '.[test]' && {python} -m pytest" in out

    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == "my-env" and project["project"]["version"] == "0.1.0"
    assert project["project"]["dependencies"] == ["atropos-rl"]
    entry_points = project["project"]["entry-points"]["atropos.environments"]
    assert entry_points == {"my-env": "my_env.env:MyEnv"}
    assert project["tool"]["setuptools"]["package-data"] == {"my_env": ["data/*.jsonl"]}
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")  # every file is Python
    env_py = (root / "my_env/env.py").read_text()
    assert "class MyEnv(Env[MyEnvConfig]):" in env_py and 'name = "my-env"' in env_py
    assert len((root / "my_env/data/train.jsonl").read_text().splitlines()) >= 5
    readme = (root / "README.md").read_text()
    assert f"{python} -m pip install -e '.[test]'" in readme and f"{python} -m pytest" in readme
    assert f"{atropos_command()} env process my-env" in readme


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [
        ("my-env", "my_env", "MyEnv"),
        ("gsm8k_ru", "gsm8k_ru", "Gsm8kRuEnv"),
        ("Wordle", "Wordle", "WordleEnv"),
        ("env", "env", "EnvEnv"),  # never the `Env` base class it subclasses
    ],
)
def test_package_names(name, module, cls):
    names = package_names(name)
    assert (names.name, names.module, names.cls, names.config_cls) == (
        name,
        module,
        cls,
        f"{cls}Config",
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my env", "use letters, digits, '-' and '_', starting with a letter"),
        ("9lives", "starting with a letter"),
        ("-env", "starting with a letter"),
        ("my.env", "use letters, digits"),
        ("", "use letters, digits"),
        ("json", "its module 'json' would shadow"),
        ("class", "its module 'class' would shadow"),
        ("atropos", "its module 'atropos' would shadow"),
    ],
)
def test_bad_names_are_refused(name, message, tmp_path, capsys):
    with pytest.raises(ScaffoldError, match=message):
        package_names(name)
    assert atropos_main(["env", "new", "--dir", str(tmp_path), "--", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"atropos env new: error: environment name {name!r}: ")
    assert err.count("\n") == 1 and not list(tmp_path.iterdir())  # one line, nothing written


def test_an_existing_folder_is_kept_unless_forced(tmp_path, capsys):
    root = tmp_path / "my-env"
    root.mkdir()
    assert atropos_main(["env", "new", "my-env", "--dir", str(tmp_path)]) == 0  # empty: fine
    env_py = root / "my_env" / "env.py"
    env_py.write_text("# edited\n")
    (root / "notes.txt").write_text("mine")
    capsys.readouterr()

    assert atropos_main(["env", "new", "my-env", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"atropos env new: error: {root} exists and is not empty; pick another name or --dir,"
        " or pass --force to overwrite the package's files in it\n"
    )
    assert env_py.read_text() == "# edited\n"

    assert atropos_main(["env", "new", "my-env", "--dir", str(tmp_path), "--force"]) == 0
    assert env_py.read_text().startswith('"""`my-env`')
    assert (root / "notes.txt").read_text() == "mine"  # not the package's: left alone


def test_a_file_in_the_way_is_refused_even_with_force(tmp_path):
    (tmp_path / "my-env").write_text("")
    with pytest.raises(ScaffoldError, match="exists and is not a folder"):
        write_package("my-env", tmp_path, force=True)


def test_env_new_help(capsys):
    with pytest.raises(SystemExit) as done:
        atropos_main(["env", "new", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: atropos env new [-h] [--dir PATH] [--force] name" in out
    assert "-m pip install -e '.[test]'" in out


# ----- installed into a throwaway virtualenv --------------------------------------------------


def run(cmd: list[str], what: str, timeout: float, **kwargs) -> str:
    """Run `cmd` to the end (at most `timeout` s, waiting for `what`); its stdout. A failure
    or a timeout fails the test with the command's output."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: not done after {timeout} s: {cmd}\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def throwaway_venv(where: Path) -> Path:
    """A virtualenv at `where` that sees the packages of the interpreter running the tests; its
    python.

    `--system-site-packages` shows the base interpreter's packages, not those of a virtualenv
    the tests run in; so a `.pth` file adds this interpreter's site directories (their `.pth`
    files, editable installs included, are read too). Nothing is installed outside `where`."""
    timeout = 60
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)],
        "creating the virtualenv", timeout)  # fmt: skip
    python = where / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = run([str(python), "-c", code], "the virtualenv's site directory", timeout).strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
    (Path(purelib) / "_atropos_test_parent.pth").write_text("\n".join(lines) + "\n")
    return python


@pytest.mark.slow
def test_the_package_installs_passes_its_tests_and_is_listed(tmp_path):
    """~10-40 s: a virtualenv, an editable install of the new package (no network), its tests
    in that virtualenv, then `atropos env list` there."""
    write_package("my-env", tmp_path)
    package = tmp_path / "my-env"
    python = throwaway_venv(tmp_path / "venv")
    source = str(Path(atropos.__file__).resolve().parents[1])  # this checkout's atropos
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATROPOS_", "PYTEST_"))}
    env |= {"PYTHONPATH": os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])}
    env |= {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}

    where = run([str(python), "-c", "import atropos; print(atropos.__file__)"],
                "importing atropos in the virtualenv", 60, env=env)  # fmt: skip
    assert where.strip().startswith(source)
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e",
         str(package)], "pip installing the package", 300, env=env)  # fmt: skip
    tests = run([str(python), "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider"],
                "the package's own tests", 300, env=env, cwd=package)  # fmt: skip
    assert "4 passed" in tests, tests

    listing = run([str(python), "-m", "atropos", "env", "list"],
                  "atropos env list in the virtualenv", 120, env=env, cwd=tmp_path)  # fmt: skip
    [row] = [line for line in listing.splitlines() if line.startswith("my-env ")]
    assert row.split()[1:5] == ["plugin", "my-env", "0.1.0", "Answer"], row
    assert any(
        line.split()[:4] == ["arithmetic", "builtin", "built", "in"]
        for line in listing.splitlines()
    )
