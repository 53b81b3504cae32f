"""Upstream's own black-box API tests (atroposlib 0.4.0 wheel) pass against our server.

The three files hard-code http://localhost:8000 and first try to spawn upstream's server there.
We bind 127.0.0.1:8000 first (and hold [::1]:8000 where IPv6 exists), so their spawn fails and
their readiness probe (`GET /info`) finds ours. A probe plugin (`upstream_probe.py`) records, per
test, that the server answering is ours (`GET /health`, a route upstream lacks) and that every
upstream server the tests spawned exited.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import COMPAT_DIR, http_get, port_is_free, run_our_server, upstream_env

pytestmark = [pytest.mark.compat, pytest.mark.slow]

PORT = 8000  # hard-coded in upstream's tests
EXPECTED = {  # tests per file in the atroposlib 0.4.0 wheel
    "test_api_legacy": 3,
    "test_api_compression": 7,
    "test_api_messages_handling": 26,
}
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


@contextlib.contextmanager
def hold_ipv6_loopback(port: int) -> Iterator[None]:
    """Bind [::1]:port for the duration, so an upstream server cannot listen there."""
    sock = None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(("::1", port))
    except OSError as err:
        if sock is not None:
            sock.close()
            sock = None
        if err.errno == errno.EADDRINUSE:
            pytest.skip(f"[::1]:{port} is in use; upstream's tests could reach that server")
    try:
        yield
    finally:
        if sock is not None:
            sock.close()


def summary_counts(output: str) -> Counter[str]:
    """Counts from pytest's final line, e.g. '36 passed, 1 warning in 1.1s'."""
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|error)", ln)]
    last = [ln for ln in lines if re.search(r" in [\d.]+s", ln)]
    assert last, f"no pytest summary line in upstream's output:\n{output}"
    counts: Counter[str] = Counter()
    for n, what in re.findall(r"(\d+) (\w+)", last[-1]):
        counts[what.rstrip("s") if what in ("errors", "warnings") else what] += int(n)
    return counts


def junit_outcomes(path: Path) -> dict[str, Counter[str]]:
    """Per upstream test module: how many cases passed, failed, errored or were skipped."""
    per_module: dict[str, Counter[str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        module = next((m for m in EXPECTED if m in classname), classname)
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        per_module.setdefault(module, Counter())[kinds[0] if kinds else "passed"] += 1
    return per_module


def test_upstream_black_box_api_tests_pass_against_our_server(
    tmp_path: Path, upstream_python: Callable[[str], Path]
) -> None:
    python = upstream_python("light")
    found = subprocess.run(
        [str(python), "-c", "import atroposlib, os; print(os.path.dirname(atroposlib.__file__))"],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stderr
    tests_dir = Path(found.stdout.strip()) / "tests"
    files = [tests_dir / f"{name}.py" for name in EXPECTED]
    for f in files:
        assert f.exists(), f"{f} is missing from the installed atroposlib 0.4.0 wheel"

    if not port_is_free("127.0.0.1", PORT):
        pytest.skip(
            f"127.0.0.1:{PORT} is taken; upstream's API tests hard-code http://localhost:{PORT}"
        )
    (tmp_path / "pytest.ini").write_text(PYTEST_INI)
    shutil.copy(COMPAT_DIR / "upstream_probe.py", tmp_path / "upstream_probe.py")
    probe_out = tmp_path / "probe.jsonl"
    junit = tmp_path / "junit.xml"
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "upstream_probe",
        "-c",
        str(tmp_path / "pytest.ini"),
        "--rootdir",  # site-packages: node ids and junit class names start "atroposlib.tests."
        str(tests_dir.parent.parent),
        f"--junitxml={junit}",
        "-q",
        "-rfEs",
        *map(str, files),
    ]
    env = upstream_env(PYTHONPATH=str(tmp_path), ATROPOS_COMPAT_PROBE_OUT=str(probe_out))

    with hold_ipv6_loopback(PORT), run_our_server(tmp_path, port=PORT) as server:
        started = time.monotonic()
        done = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
        elapsed = time.monotonic() - started
        still_ours = server.alive() and http_get(f"{server.url}/health")[1] == {"status": "ok"}
        server_log = server.log_text()
    output = done.stdout + done.stderr
    report = f"upstream pytest exit {done.returncode} after {elapsed:.1f} s:\n{output}"

    # 1. Our server answered every test: the probe saw our /health before each test body.
    probes = [json.loads(line) for line in probe_out.read_text().splitlines()]
    assert len(probes) == sum(EXPECTED.values()), report
    not_ours = [p for p in probes if p["health"] != {"status": 200, "body": '{"status":"ok"}'}]
    assert not not_ours, f"not our server answering at localhost:{PORT}: {not_ours}\n{report}"
    # ... and each upstream server their fixtures spawned (one per module) lost and exited.
    spawned = {s["pid"]: s for p in probes for s in p["upstream_servers"]}
    assert len(spawned) == len(EXPECTED), f"{spawned}\n{report}"
    running = [s for s in spawned.values() if s["state"] not in (None, "Z")]
    assert not running, f"upstream's own server kept running: {running}\n{report}"
    assert still_ours, f"our server died during upstream's tests:\n{server_log}"
    assert "Traceback" not in server_log, server_log

    # 2. Exact counts, overall and per file.
    assert done.returncode == 0, report
    counts = summary_counts(output)
    assert counts["passed"] == 36, report
    assert not {k: v for k, v in counts.items() if k not in ("passed", "warning")}, report
    per_module = junit_outcomes(junit)
    assert per_module == {m: Counter(passed=n) for m, n in EXPECTED.items()}, report
