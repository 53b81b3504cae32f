"""Run the real `harbor` CLI (PyPI `harbor`, which needs Python >= 3.12) on a machine whose own
Python is older: a Debian trixie root (Python 3.13) made by mmdebstrap, `harbor` installed in
a venv inside it from the package index, and every command run in it with bubblewrap.

    python scripts/harbor_cli.py tasks init atropos/my-task --verifier-mode shared -p /tmp/tasks

The root is built once under `$XDG_CACHE_HOME/atropos/harbor-cli/<version>/root` (49 s in
all on a fresh 2-core machine, mmdebstrap and pip about half each; 605 MB) and reused.
Building reaches the Debian mirror and the package index (the host's CA bundle and
resolv.conf are lent to pip); running a command does not (no network), with the folder of
`-p`/`--tasks-dir` (default: the current one) bound writable at `/work` inside. Needs root,
mmdebstrap and bwrap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.25.0"
SUITE, MIRROR = "trixie", "http://deb.debian.org/debian"
PACKAGES = "python3,python3-pip,python3-venv,ca-certificates"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_ENV = ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]


def cache_root(version: str = VERSION) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "atropos" / "harbor-cli" / version / "root"


def ensure_root(version: str = VERSION, timeout: float = 900.0) -> Path:
    """The root with `harbor==version` installed, built when absent (renamed into place
    whole, so a killed build leaves nothing half-made under the name)."""
    root = cache_root(version)
    if (root / "opt/harbor/bin/harbor").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".build-") as scratch:
        partial = Path(scratch) / "root"
        _run(["mmdebstrap", "--variant=apt", "--quiet", f"--include={PACKAGES}", SUITE,
              str(partial), MIRROR], timeout)  # fmt: skip
        (partial / "work").mkdir()
        install = [
            "bwrap", "--bind", str(partial), "/", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
            "--ro-bind", str(HOST_CA), "/etc/host-ca.crt", "--share-net", *BASE_ENV,
            "--setenv", "HOME", "/root", "--setenv", "PIP_CERT", "/etc/host-ca.crt",
            "sh", "-c", "python3 -m venv /opt/harbor && /opt/harbor/bin/pip install -q"
            f" --disable-pip-version-check harbor=={version}",
        ]  # fmt: skip
        _run(install, timeout)
        if root.exists():
            shutil.rmtree(root)
        partial.rename(root)
    return root


def harbor(args: list[str], cwd: Path | None = None, timeout: float = 120.0) -> str:
    """Run `harbor ARGS` in the root, without network, the tasks folder (`-p`/`--tasks-dir`,
    else `cwd`) bound writable at `/work` inside; its output."""
    root = ensure_root()
    where, args = Path(cwd or Path.cwd()).resolve(), list(args)
    for flag in ("-p", "--tasks-dir"):
        if flag in args:
            at = args.index(flag) + 1
            where, args[at] = Path(args[at]).resolve(), "/work"
    where.mkdir(parents=True, exist_ok=True)
    argv = [
        "bwrap", "--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
        "--tmpfs", "/tmp", "--bind", str(where), "/work", "--unshare-net", *BASE_ENV,
        "--setenv", "HOME", "/tmp", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--chdir", "/work", "/opt/harbor/bin/harbor", *args,
    ]  # fmt: skip
    return _run(argv, timeout)


def _run(argv: list[str], timeout: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-3000:]
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {said}")
    return done.stdout


if __name__ == "__main__":
    print(harbor(sys.argv[1:]), end="")
