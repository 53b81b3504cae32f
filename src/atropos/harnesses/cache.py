"""Installing harnesses on the host, once: each under `~/.cache/atropos/harnesses/
<name>-<version>` (`ATROPOS_HARNESS_CACHE` moves the root; `cache_root` says when it is
`/var/cache/atropos/harnesses` instead), made in a temporary folder beside
it and renamed into place when complete, so a folder that exists is a whole install and an
interrupted one leaves only a `.partial-*` folder, removed by the next try.

Two kinds: an npm package (`npm_package`: `npm install --prefix`, the package's `bin/` on
PATH) and a Python package in a venv of its own (`python_venv`: the system's Python 3, whose
files under `/usr` every sandbox already sees). Each runs with a deadline and says what it
does on stderr; a failure is `HarnessInstallError` with the end of the installer's output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["HarnessInstallError", "cache_root", "installed_dir", "npm_package", "python_venv"]

INSTALL_TIMEOUT = 900.0  # seconds per install step; a cold npm or venv install takes under 2 min


class HarnessInstallError(RuntimeError):
    """A harness could not be installed on the host."""


SHARED_CACHE = Path("/var/cache/atropos/harnesses")


def cache_root() -> Path:
    """Where harnesses are installed: `$ATROPOS_HARNESS_CACHE`, else
    `~/.cache/atropos/harnesses`, unless that is out of other users' reach (a home of mode
    0700, as root's often is) while we are root: sandboxes run as uids of their own, which
    must read the harness's files, so then `/var/cache/atropos/harnesses`."""
    root = os.environ.get("ATROPOS_HARNESS_CACHE")
    if root:
        return Path(root)
    home = Path.home() / ".cache" / "atropos" / "harnesses"
    if os.geteuid() == 0 and not _reachable(home):
        return SHARED_CACHE
    return home


def _reachable(path: Path) -> bool:
    """Whether other users may traverse every existing folder down to `path`."""
    for folder in [*reversed(path.parents), path]:
        if folder.exists() and not folder.stat().st_mode & 0o001:
            return False
    return True


def installed_dir(name: str, version: str, make: Callable[[Path], None]) -> Path:
    """The cache folder of `name`-`version`, made by `make(folder)` when absent (in a temporary
    folder renamed into place, so a half install is never taken for a whole one)."""
    target = cache_root() / f"{name}-{version}"
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    for stale in target.parent.glob(f".partial-{name}-{version}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".partial-{name}-{version}-", dir=target.parent))
    work.chmod(0o755)  # sandboxes' own uids read it
    work.chmod(0o755)  # mkdtemp's 0700 would hide the install from the sandboxes' uids
    try:
        _say(f"installing {name} {version} into {target} (once; cached)")
        started = time.monotonic()
        make(work)
        (work / ".complete").write_text(f"{name} {version}\n")
        if target.exists():  # an older half install without its marker, or a racing one
            shutil.rmtree(target, ignore_errors=True)
        try:
            work.rename(target)
        except OSError:
            if not (target / ".complete").is_file():
                raise
        _say(f"installed {name} {version} in {time.monotonic() - started:.0f} s")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def npm_package(name: str, package: str, version: str) -> Path:
    """`package@version` installed with npm under the cache (its executables in
    `<folder>/node_modules/.bin`)."""

    def make(folder: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise HarnessInstallError(
                f"{name} needs npm (Node 20+): apt-get install -y nodejs npm, then retry"
            )
        run(
            [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund",
             "--loglevel=error", f"{package}@{version}"],
            f"npm install {package}@{version}",
        )  # fmt: skip

    return installed_dir(name, version, make)


def python_venv(
    name: str, requirement: str, version: str, python: str = "/usr/bin/python3"
) -> Path:
    """A venv of the system's Python (`python`) under the cache with `requirement`
    installed. The venv's interpreter is a link to `python`, which the sandboxes see."""

    def make(folder: Path) -> None:
        if not Path(python).exists():
            raise HarnessInstallError(
                f"{name} needs {python} (the system's Python 3, which sandboxes see): "
                "apt-get install -y python3 python3-venv"
            )
        run([python, "-m", "venv", str(folder)], f"{python} -m venv")
        pip = [str(folder / "bin" / "python"), "-m", "pip"]
        run([*pip, "install", "-q", "--disable-pip-version-check", requirement], requirement)

    return installed_dir(name, version, make)


def run(argv: list[str], what: str, timeout: float = INSTALL_TIMEOUT) -> None:
    """Run one install step with a deadline; HarnessInstallError with its output's end."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HarnessInstallError(f"{what}: not done within {timeout:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise HarnessInstallError(f"{what} failed (exit {done.returncode}): {tail}")


def _say(message: str) -> None:
    print(f"atropos.harnesses: {message}", file=sys.stderr, flush=True)
