"""The run's API key: made when a process listens beyond loopback, kept in a private file.

The key goes to every process through its environment (`supervise.KEY_VARIABLES`), never on a
command line that `ps` shows. It lives in `RUN_DIR/api.key` (mode 0600), so a Slurm step or a
Ray actor on another node that shares the run directory reads the same key, and a restarted
launch of the same run keeps it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from atropos.launch.plan import Plan
from atropos.names import is_loopback

KEY_FILE = "api.key"


def needs_key(plan: Plan) -> bool:
    """Whether any process binds beyond loopback (the API or an inference server)."""
    return any(
        p.role in ("api", "inference") and not is_loopback(p.host, resolve=True)
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
