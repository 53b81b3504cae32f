"""The run's secrets: its API key and the run file's secret environment, in private files.

The key is made when a process listens beyond loopback. It goes to every process through its
environment (`supervise.KEY_VARIABLES`), never on a command line that `ps` shows. It lives in
`RUN_DIR/api.key` (mode 0600), so a Slurm step or a Ray actor on another node that shares the
run directory reads the same key, and a restarted launch of the same run keeps it.

Secret environment values (`config.is_secret`) go the same way where a process is started by
another program than this one: a Slurm job's steps read them from `RUN_DIR/secrets.json` (mode
0600, process name -> variable -> value). The local backend hands them to its supervisors in
memory, Ray as the actor's arguments, as it does the key. Every file of launch that could hold
a secret is written with `write_private` (owner only).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from atropos.launch.plan import Plan
from atropos.names import is_loopback

KEY_FILE = "api.key"
SECRETS_FILE = "secrets.json"


def needs_key(plan: Plan) -> bool:
    """Whether any process binds beyond loopback (the API or an inference server), or is an
    `atropos local serve`: its routes that replace weights are open to every local process
    without a key, so a run that starts one always makes a key for it."""
    return any(
        p.role in ("api", "inference")
        and (not is_loopback(p.host, resolve=True) or p.argv[2:5] == ["atropos", "local", "serve"])
        for p in plan.processes
    )


def run_key(plan: Plan, force: bool = False) -> str | None:
    """The run's key (made on first use) when the plan needs one, else `$ATROPOS_API_KEY` or
    None."""
    if not (force or needs_key(plan)):
        return os.environ.get("ATROPOS_API_KEY") or None
    return read_or_make(plan.run_dir / KEY_FILE)


def read_or_make(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path`, readable by its owner only (`mode`), from its first byte on.

    Written whole through a temporary file, so a reader never sees half of it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a leftover temporary file keeps its old mode otherwise
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def write_secrets(run_dir: Path, values: Mapping[str, Mapping[str, str]]) -> None:
    """`RUN_DIR/secrets.json` (0600): every process's secret environment; removed when the run
    has none, so no earlier run's secrets stay behind."""
    path = run_dir / SECRETS_FILE
    if not any(values.values()):
        path.unlink(missing_ok=True)
        return
    write_private(path, json.dumps({k: dict(v) for k, v in values.items() if v}, indent=1))


def read_secrets(run_dir: Path, name: str) -> dict[str, str]:
    """The secret environment of process `name` from `RUN_DIR/secrets.json` ({} when none)."""
    try:
        doc = json.loads((run_dir / SECRETS_FILE).read_text())
    except FileNotFoundError:
        return {}
    values = doc.get(name, {}) if isinstance(doc, dict) else {}
    return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}
