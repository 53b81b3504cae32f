"""The process supervisor with plain commands: restarts, their limit, deadlines, stopping."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from atropos.launch.config import Restart
from atropos.launch.plan import Gate, Process
from atropos.launch.supervise import Supervisor


def supervisor(tmp_path: Path, code: str, **fields: object) -> Supervisor:
    proc = Process(
        name="p", role="env", argv=["{python}", "-c", code], gate=Gate(kind="none"),
        restart=fields.pop("restart", Restart(backoff=0.05)), ready_timeout=5, grace=5,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip
    return Supervisor(proc, run_dir=tmp_path, book={}, python=sys.executable)


def wait_done(sup: Supervisor, deadline: float = 20) -> None:
    end = time.monotonic() + deadline
    while not sup.done and time.monotonic() < end:
        time.sleep(0.05)
    assert sup.done, sup.status()


def test_a_crashing_process_is_restarted_up_to_its_limit(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, "print('up', flush=True); raise SystemExit(3)")
    sup.begin()
    wait_done(sup)
    status = sup.status()
    assert status.state == "failed" and status.restarts == 3
    assert status.exit_codes == [3, 3, 3, 3]
    assert "p exited with 3 after 3 restarts" in status.reason
    log = (tmp_path / "logs" / "p.log").read_text()
    assert log.count("up\n") == 4 and log.count("=== ") == 4  # one log across restarts


def test_exit_zero_is_done_and_never_means_never(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, "import time; time.sleep(0.5)")
    sup.begin()
    wait_done(sup)
    assert sup.status().state == "exited" and sup.status().restarts == 0
    never = supervisor(tmp_path, "raise SystemExit(5)", restart=Restart(policy="never"))
    never.begin()
    wait_done(never)
    assert never.status().state == "failed" and never.status().exit_codes == [5]


def test_stop_kills_a_process_that_ignores_sigterm_after_grace(tmp_path: Path) -> None:
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print(child.pid, flush=True); time.sleep(60)"
    )
    sup = supervisor(tmp_path, code)
    sup.begin()
    assert sup.wait_settled(10) == "ready"
    log = tmp_path / "logs" / "p.log"
    end = time.monotonic() + 10
    while len(log.read_text().splitlines()) < 2 and time.monotonic() < end:
        time.sleep(0.05)
    child = int(log.read_text().splitlines()[1])
    t0 = time.monotonic()
    assert sup.stop(grace=0.5) == 128 + 9
    assert time.monotonic() - t0 < 5
    assert sup.status().state == "stopped"
    time.sleep(0.1)
    try:  # the grandchild went with its process group
        os.kill(child, 0)
        alive = not Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
    except ProcessLookupError:
        alive = False
    assert not alive


def test_missing_the_deadline_fails_with_what_it_waited_for(tmp_path: Path) -> None:
    proc_url = "http://127.0.0.1:9/health"  # discard port: nothing answers
    sup = supervisor(tmp_path, "import time; print('busy', flush=True); time.sleep(60)")
    sup.proc.gate = Gate(kind="http", url=proc_url)
    sup.proc.ready_timeout = 1
    sup.begin()
    assert sup.wait_settled(10) == "failed"
    reason = sup.status().reason
    assert "p was not ready within 1 s (waited for GET http://127.0.0.1:9/health" in reason
    assert "busy" in reason


def test_the_live_table_shows_each_process(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from atropos.launch.config import RunFile
    from atropos.launch.driver import RunStats, table
    from atropos.launch.plan import build

    plan = build(
        RunFile.model_validate({"envs": [{"name": "arithmetic"}], "trainer": {"model": "tiny"}}),
        tmp_path,
    )
    sup = supervisor(tmp_path, "import time; time.sleep(30)")
    sup.begin()
    try:
        assert sup.wait_settled(10) == "ready"
        status = sup.status()
        out = io.StringIO()
        Console(file=out, width=120).print(table([status], RunStats(lambda: None, None), plan))
    finally:
        sup.stop(1)
    text = out.getvalue()
    assert "atropos launch: atropos (local)" in text
    assert "waiting for the API's /stats" in text
    assert "│ p       │ ready │ 0        │ 0:00:0" in text and str(status.pid) in text


def test_a_usage_error_before_ready_is_not_restarted(tmp_path: Path) -> None:
    sup = supervisor(
        tmp_path, "print('error: unknown flag --prot', flush=True); raise SystemExit(2)"
    )
    sup.proc.gate = Gate(kind="http", url="http://127.0.0.1:9/health")  # never ready
    sup.begin()
    wait_done(sup)
    status = sup.status()
    assert status.state == "failed" and status.restarts == 0 and status.exit_codes == [2]
    assert "unknown flag --prot" in status.reason


def test_a_log_gate_waits_for_its_line_since_the_latest_start(tmp_path: Path) -> None:
    """A resumed trainer is ready once it logged its new registration; the line of an earlier
    start in the same log does not count."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "p.log").write_text("registered with http://old\n")
    code = (
        "import time; time.sleep(1.5); print('registered with http://x', flush=True);"
        " time.sleep(30)"
    )
    sup = supervisor(tmp_path, code)
    sup.proc.gate = Gate(kind="none", log="registered with ")
    began = time.monotonic()
    sup.begin()
    try:
        assert sup.wait_settled(10) == "ready"
        assert time.monotonic() - began >= 1.4
    finally:
        sup.stop(1)
