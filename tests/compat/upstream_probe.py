"""A pytest plugin loaded into upstream's own test run (`-p upstream_probe`, upstream venv).

It changes nothing in upstream's tests. Just before each test body runs (after upstream's
fixtures tried to spawn upstream's server), it records:

* who answers at http://localhost:8000: our API answers `GET /health` with {"status": "ok"};
  upstream's has no such route (FastAPI 404);
* every child process this pytest spawned with `atroposlib.cli.run_api` (upstream's server),
  waiting up to 20 s for it to exit: it must lose the race for port 8000 and die.

One JSON line per test goes to the file named by $ATROPOS_COMPAT_PROBE_OUT.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

OUT = Path(os.environ["ATROPOS_COMPAT_PROBE_OUT"])
URL = "http://localhost:8000/health"
_waited: set[int] = set()  # pids already given their 20 s


def _proc_state(pid: int) -> str | None:
    """The state letter of `pid` (R, S, Z, ...), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def _children() -> list[tuple[int, str]]:
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == me:
            found.append((int(entry.name), cmdline.strip()))
    return found


def _health() -> dict[str, object]:
    try:
        with urllib.request.urlopen(URL, timeout=5) as resp:
            return {"status": resp.status, "body": resp.read().decode()}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "body": err.read().decode()}
    except OSError as err:
        return {"status": None, "body": repr(err)}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    spawned = []
    for pid, cmdline in _children():
        if "atroposlib.cli.run_api" not in cmdline:
            continue
        deadline = time.monotonic() + (0 if pid in _waited else 20)
        _waited.add(pid)
        state = _proc_state(pid)
        while state not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
            state = _proc_state(pid)
        spawned.append({"pid": pid, "cmdline": cmdline, "state": state})
    record = {"nodeid": item.nodeid, "health": _health(), "upstream_servers": spawned}
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")
