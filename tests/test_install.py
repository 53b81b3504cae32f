"""`atropos.install`: the install hint fits how atropos was installed (an editable checkout, a
wheel), names the interpreter that runs it, and is the only one in the package."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from atropos import install
from atropos.install import atropos_command, install_hint, pip_command, python_command

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "atropos"


class FakeDistribution:
    """A distribution's metadata as `importlib.metadata` reads it: only `direct_url.json`."""

    def __init__(self, direct_url: dict[str, object] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        if name == "direct_url.json" and self.direct_url is not None:
            return json.dumps(self.direct_url)
        return None


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """Install atropos, as far as `atropos.install` can tell: `installed(direct_url, package)`
    makes the distribution's `direct_url.json` (None: none, as from a wheel) and the folder the
    package lies in; `python` is not this interpreter on PATH."""

    def make(direct_url: dict[str, object] | None, package: Path) -> None:
        dist = FakeDistribution(direct_url)
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
        monkeypatch.setattr(install, "_PACKAGE", package)

    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    return make


def editable(folder: Path) -> dict[str, object]:
    return {"url": folder.as_uri(), "dir_info": {"editable": True}}


def test_an_editable_checkout_gets_pip_install_e_of_the_checkout(installed, tmp_path):
    checkout = tmp_path / "my atropos"  # a space: the command quotes it
    installed(editable(checkout), checkout / "src" / "atropos")
    python = shlex.quote(sys.executable)
    assert install_hint("envs") == f"{python} -m pip install -e '{checkout}[envs]'"
    assert install_hint(["vision", "envs", "vision"]).endswith("[envs,vision]'")


def test_a_wheel_gets_pip_install_of_the_distribution(installed, tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    installed(None, site / "atropos")  # a wheel's install has no direct_url.json
    python = shlex.quote(sys.executable)
    assert install_hint("envs") == f"{python} -m pip install 'atropos-rl[envs]'"


def test_a_folder_installed_without_e_is_a_wheel_install(installed, tmp_path):
    site = tmp_path / "site-packages"
    installed({"url": (tmp_path / "src").as_uri(), "dir_info": {}}, site / "atropos")
    assert install_hint("hub").endswith(" -m pip install 'atropos-rl[hub]'")


def test_an_editable_install_of_another_checkout_is_not_this_one(installed, tmp_path):
    """The metadata names another checkout than the one running: the running one decides."""
    installed(editable(tmp_path / "other"), tmp_path / "site-packages" / "atropos")
    assert install_hint("ray").endswith(" -m pip install 'atropos-rl[ray]'")


def test_source_on_sys_path_without_metadata_is_a_checkout(monkeypatch, tmp_path):
    checkout = tmp_path / "atropos"
    (checkout / "src" / "atropos").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    (checkout / ".git").mkdir()

    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setattr(install, "_PACKAGE", checkout / "src" / "atropos")
    assert install_hint("games").endswith(f" -m pip install -e '{checkout}[games]'")


def test_this_checkout_is_found():
    """The tests run from a checkout (make test installs it editable)."""
    assert install.checkout() == ROOT


def test_python_is_named_python_only_when_that_name_runs_it(monkeypatch, tmp_path):
    exe = tmp_path / "venv dir" / "bin" / "python3"
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.setattr(install.shutil, "which", lambda name: str(exe.parent / name))
    assert python_command() == "python"  # the virtualenv is activated
    assert pip_command() == "python -m pip"
    monkeypatch.setattr(install.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert python_command() == shlex.quote(str(exe)) == f"'{exe}'"
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    assert pip_command() == f"'{exe}' -m pip"


def test_atropos_is_the_script_beside_the_interpreter(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    assert atropos_command() == f"{bin_dir / 'python'} -m atropos"  # no script: the module
    (bin_dir / "atropos").write_text("")
    assert atropos_command() == str(bin_dir / "atropos")
    monkeypatch.setattr(install.shutil, "which", lambda name: str(bin_dir / name))
    assert atropos_command() == "atropos"


def test_an_activated_virtualenv_needs_no_activation(monkeypatch, tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    assert install.activate_command() == ". .venv/bin/activate"
    monkeypatch.setattr(install.shutil, "which", lambda name: str(venv / "bin" / name))
    assert install.activate_command() is None


# Where a bare `pip install` may stay: advice for another Python than this one, or test data.
BARE_PIP_ALLOWED = {
    "engines.py": "vLLM goes into a virtualenv of its own, which has its own pip",
    "inference/errors.py": "a doctest's made-up ImportError message",
}


def test_no_hint_but_install_hint_names_the_distribution_extras():
    """Every install hint of the package comes from `install_hint`: no hardcoded
    `pip install 'atropos-rl[...]'` and no `pip` that is not `PYTHON -m pip`."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative == "install.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "pip install 'atropos-rl[" in line or "pip install atropos-rl[" in line:
                found.append(f"{relative}:{number}: {line.strip()}")
            elif re.search(r"(?<!-m )\bpip install\b", line) and relative not in BARE_PIP_ALLOWED:
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "use atropos.install.install_hint:\n" + "\n".join(found)


def test_the_demo_ends_with_how_to_use_its_virtualenv(monkeypatch, tmp_path):
    from atropos.demo.run import next_lines

    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    (venv / "bin" / "atropos").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    monkeypatch.setattr(install.shutil, "which", lambda name: None)  # not activated
    lines = next_lines()
    assert (
        lines[1].startswith("  . .venv/bin/activate ") and str(venv / "bin" / "atropos") in lines[1]
    )
    assert "  make extras " in "\n".join(lines)  # the tests run in a checkout
    assert lines[-1].startswith("  atropos env list ")
    monkeypatch.setattr(install.shutil, "which", lambda name: str(venv / "bin" / name))
    assert not any("activate" in line for line in next_lines())  # activated: nothing to say
