"""The commands a hint prints: how to install an extra, and how to run Python, pip and atropos.

A leaf of the package (standard library only), so every layer prints the same commands. Each
is one a user can paste into a new shell and have work, as atropos was installed:

- **Interpreter.** `python` when `python` on `PATH` is this interpreter (an activated
  virtualenv), else this interpreter's full path (`/home/me/atropos/.venv/bin/python`).
- **Extras.** In a source checkout (an editable install, or `src/` on `sys.path`):
  `PYTHON -m pip install -e '/path/to/checkout[envs]'`, which also refreshes the checkout's
  metadata; installed from a wheel or an sdist: `PYTHON -m pip install 'atropos-rl[envs]'`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = [
    "DISTRIBUTION",
    "activate_command",
    "atropos_command",
    "checkout",
    "install_hint",
    "pip_command",
    "python_command",
]

DISTRIBUTION = "atropos-rl"
_PACKAGE = Path(__file__).resolve().parent  # .../atropos


def python_command() -> str:
    """This interpreter as a command: `python` when that name on `PATH` runs it (an activated
    virtualenv), else its full path, quoted for a POSIX shell where needed."""
    exe = sys.executable
    if not exe:
        return "python"
    found = shutil.which("python")
    # Symlinks are not followed: a venv's python links to the system's, yet is another install.
    if found and Path(os.path.abspath(found)).parent == Path(os.path.abspath(exe)).parent:
        return "python"
    return shlex.quote(exe)


def pip_command() -> str:
    """pip of this interpreter: `PYTHON -m pip` (never a bare `pip`, which may be another's)."""
    return f"{python_command()} -m pip"


def atropos_command() -> str:
    """The `atropos` command of this install: `atropos` when that name on `PATH` is it, else
    the script beside this interpreter by its full path, else `PYTHON -m atropos`."""
    script = Path(os.path.abspath(sys.executable or "python")).parent / "atropos"
    found = shutil.which("atropos")
    if found and Path(os.path.abspath(found)) == script:
        return "atropos"
    if script.is_file():
        return shlex.quote(str(script))
    return f"{python_command()} -m atropos"


def activate_command() -> str | None:
    """`. VENV/bin/activate` when this interpreter is a virtualenv's that is not activated
    (the path relative to the current directory when it lies below it); None otherwise."""
    if sys.prefix == sys.base_prefix or python_command() == "python":
        return None
    script = Path(sys.prefix) / "bin" / "activate"
    if not script.is_file():
        return None
    try:
        shown = str(script.relative_to(Path.cwd()))
    except ValueError:
        shown = str(script)
    return f". {shlex.quote(shown)}"


def checkout() -> Path | None:
    """The source checkout atropos runs from, or None when it was installed from a wheel or
    an sdist: an editable install's folder (its `direct_url.json`), else the folder above
    `src/atropos` when it holds a pyproject.toml and a `.git` (atropos imported from source)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        found = _editable_folder(dist.read_text("direct_url.json"))
        if found is not None and _PACKAGE.is_relative_to(found.resolve()):
            return found
    root = _PACKAGE.parent.parent
    if (root / "pyproject.toml").is_file() and (root / ".git").exists():
        return root
    return None


def _editable_folder(direct_url: str | None) -> Path | None:
    """The folder of an editable install, from its `direct_url.json` (PEP 610); else None."""
    if not direct_url:
        return None
    try:
        info = json.loads(direct_url)
    except ValueError:
        return None
    url = str(info.get("url", "")) if isinstance(info, dict) else ""
    dir_info = info.get("dir_info") if isinstance(info, dict) else None
    if not (isinstance(dir_info, dict) and dir_info.get("editable")) or not url.startswith("file:"):
        return None
    return Path(unquote(urlsplit(url).path))


def install_hint(extras: str | Iterable[str]) -> str:
    """The command that installs `atropos-rl`'s `extras` into this interpreter, as atropos was
    installed: `PYTHON -m pip install -e 'CHECKOUT[extras]'` in a source checkout, else
    `PYTHON -m pip install 'atropos-rl[extras]'`.

    >>> install_hint(["vision", "envs"]).endswith("[envs,vision]'")
    True
    """
    names = [extras] if isinstance(extras, str) else sorted(set(extras))
    spec = ",".join(names)
    root = checkout()
    if root is not None:
        return f"{pip_command()} install -e {shlex.quote(f'{root}[{spec}]')}"
    return f"{pip_command()} install {shlex.quote(f'{DISTRIBUTION}[{spec}]')}"
