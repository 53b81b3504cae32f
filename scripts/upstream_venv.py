#!/usr/bin/env python3
"""Make (once) a separate virtualenv holding upstream atroposlib 0.4.0 from PyPI; print its python.

We compare against upstream and prove wire compatibility with it, so it must never share our
environment. Two flavours, cached under .cache/:

* `light` (default): atroposlib without its heavy dependencies, plus what its API server and
  its black-box API tests import (fastapi, uvicorn, requests, pytest). About 30 s.
* `full`: atroposlib with every dependency, for running its BaseEnv client code. About 2 min.

Usage: python scripts/upstream_venv.py [light|full]
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "atroposlib==0.4.0"
LIGHT_DEPS = ["fastapi", "uvicorn[standard]", "pydantic", "requests", "pytest", "pytest-asyncio"]


def ensure(flavour: str = "light") -> Path:
    """Create the venv if missing; return the path of its python."""
    if flavour not in ("light", "full"):
        raise SystemExit(f"unknown flavour {flavour!r}: use 'light' or 'full'")
    home = ROOT / ".cache" / f"upstream-atroposlib-{flavour}"
    python = home / "bin" / "python"
    stamp = home / ".installed"
    if stamp.exists():
        return python
    print(f"creating {home} with {UPSTREAM} ({flavour}) ...", file=sys.stderr, flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if flavour == "light":
        subprocess.run([*pip, "--no-deps", UPSTREAM], check=True)
        subprocess.run([*pip, *LIGHT_DEPS], check=True)
    else:
        subprocess.run([*pip, UPSTREAM, *LIGHT_DEPS], check=True)
    stamp.write_text(UPSTREAM + "\n")
    return python


if __name__ == "__main__":
    print(ensure(sys.argv[1] if len(sys.argv) > 1 else "light"))
