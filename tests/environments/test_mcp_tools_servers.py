"""The MCP servers of `mcp_tools` as real processes: prefixed tools, shared and pooled calls,
a call past its deadline, a server that dies, servers that fail to start (one clear error,
exit 2, nothing left running), and a run stopped by SIGTERM or SIGINT leaving no server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.mcp_tools import MCPTools
from atropos.environments.mcp_tools.config import MCPServerSpec, fixture_server
from atropos.environments.mcp_tools.servers import ToolServerError, ToolServers
from atropos.envs.cli import main as env_main
from atropos.envs.config import ConfigError
from atropos.testing import FakeInferenceServer

SOURCE = str(Path(__file__).resolve().parents[2] / "src")


def fixture(name: str, **settings: Any) -> MCPServerSpec:
    """The fixture server under `name`, with `env` variables and other settings."""
    spec = fixture_server()
    env = {k: v.get_secret_value() for k, v in spec.env.items()} | settings.pop("env", {})
    return MCPServerSpec.model_validate({**spec.model_dump(), "name": name, "env": env, **settings})


def as_json(*specs: MCPServerSpec) -> str:
    """`--env.servers` for `specs`, their `env` values written out (a dump hides secrets)."""
    rows = [
        {
            **spec.model_dump(mode="json"),
            "env": {k: v.get_secret_value() for k, v in spec.env.items()},
        }
        for spec in specs
    ]
    return json.dumps(rows)


def failing(name: str, code: str) -> MCPServerSpec:
    return MCPServerSpec(name=name, command=sys.executable, args=["-c", code])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_servers_share_calls_pool_them_and_report_what_fails():
    async def main() -> list[int]:
        delay = {"ATROPOS_MCP_FIXTURE_DELAY": "0.3"}
        specs = [fixture("a"), fixture("b", env=delay, instances=2, concurrent=False)]
        servers = ToolServers(specs, restarts=1)
        await servers.start(timeout=30, stop_grace=1, prefix="auto")
        try:
            assert len(servers.pids) == 3 and not any(map(gone, servers.pids))
            assert sorted(servers.tools)[:2] == ["a__add_days", "a__convert_units"]
            assert servers.tools["b__weekday"].remote == "weekday"
            date = {"date": "2025-07-04"}
            started = time.monotonic()
            replies = await asyncio.gather(
                *(servers.call("b__weekday", date, 10, 100) for _ in range(4))
            )
            assert time.monotonic() - started >= 0.55  # two instances, one call at a time each
            assert {r.text for r in replies} == {"Friday"}
            shared = await asyncio.gather(
                *(servers.call("a__weekday", date, 10, 100) for _ in range(8))
            )
            assert {r.text for r in shared} == {"Friday"}
            bad = await servers.call("a__weekday", {"date": "4 July"}, 10, 200)
            assert bad.error and "is not a date written YYYY-MM-DD" in bad.text
            not_object = await servers.call("a__weekday", ["2025-07-04"], 10, 200)
            assert not_object.error and "must be a JSON object" in not_object.text
            late = (
                r"'b(#1)?' did not answer tools/call 'weekday' within 0.05 s \(--env.call_timeout"
            )
            with pytest.raises(ToolServerError, match=late):
                await servers.call("b__weekday", date, 0.05, 100)
            a = servers.connections[0]
            for _ in range(2):  # a died: started again, once; then the calls to it fail
                os.killpg(a.process.pid or 0, signal.SIGKILL)
                while not a.dead:
                    await asyncio.sleep(0.02)
                if len(a.history) == 1:
                    assert (await servers.call("a__weekday", date, 10, 100)).text == "Friday"
            assert len(a.history) == 2 and len(servers.pids) == 4
            with pytest.raises(ToolServerError, match="'a'.*is gone.*killed by signal 9"):
                await servers.call("a__weekday", date, 10, 100)
        finally:
            await servers.stop()
        return servers.pids

    pids = asyncio.run(main())
    assert len(pids) == 4 and all(map(gone, pids))


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            failing("bad", "import sys; sys.stderr.write('no API key for bad\\n'); sys.exit(3)"),
            [
                "MCP server 'bad' (",
                "failed to start",
                "its process exited with status 3",
                "its stderr ended with:\nno API key for bad",
            ],
        ),
        (
            MCPServerSpec(name="missing", command="/nonexistent/mcp-server"),
            ["MCP server 'missing'", "could not be started", "No such file", "never started"],
        ),
        (
            failing("mute", "import time; time.sleep(60)"),
            ["MCP server 'mute'", "did not finish the MCP handshake and tools/list within 0.5 s"],
        ),
    ],
    ids=["exits", "no-command", "mute"],
)
def test_a_server_that_fails_to_start_is_named_and_nothing_is_left_running(spec, said):
    """A server failing beside a healthy one stops it too (the mute one waits alone: the
    healthy one could not start within its short deadline)."""
    mute = spec.name == "mute"
    servers = ToolServers([spec] if mute else [fixture("fine"), spec])

    async def main() -> None:
        await servers.start(timeout=0.5 if mute else 30, stop_grace=0.3, prefix="auto")

    with pytest.raises(ConfigError) as err:
        asyncio.run(main())
    for words in said:
        assert words in str(err.value)
    assert all(map(gone, servers.pids))


def test_the_command_line_exits_2_naming_the_server(tmp_path: Path, capsys):
    bad = failing("calc", "import sys; sys.stderr.write('calc: cannot bind\\n'); sys.exit(1)")
    argv = ["process", "--env.total_steps=1", f"--env.servers={as_json(bad)}"]
    argv += [f"--env.data_path_to_save_groups={tmp_path / 'out.jsonl'}"]
    with FakeInferenceServer() as fake:
        assert env_main(MCPTools, [*argv, f"--openai.base_url={fake.base_url}"]) == 2
    err = capsys.readouterr().err
    assert "mcp_tools process: error: MCP server 'calc'" in err and "calc: cannot bind" in err


def always_calls(prompt: str) -> str:
    return '<tool_call>{"name": "weekday", "arguments": {"date": "2025-07-04"}}</tool_call>'


def start_run(tmp_path: Path, name: str, base_url: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`atropos env process mcp_tools` in a child process with two fixture servers that write
    their pids to a file (returned with the process)."""
    pidfile = tmp_path / f"{name}.pids"
    spec = fixture(name, env={"ATROPOS_MCP_FIXTURE_PIDFILE": str(pidfile)}, instances=2)
    command = [sys.executable, "-m", "atropos", "env", "process"]
    command += ["atropos.environments.mcp_tools:MCPTools", "--openai.base_url", base_url]
    command += ["--env.servers", as_json(spec), "--env.total_steps", "100000"]
    command += ["--env.group_size", "2", "--env.max_turns", "50"]
    command += ["--env.data_path_to_save_groups", str(tmp_path / f"{name}.jsonl")]
    env = {**os.environ, "PYTHONPATH": SOURCE}
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return run, pidfile


def wait_for_pids(run: subprocess.Popen[bytes], pidfile: Path, deadline: float) -> list[int]:
    """The two server pids, once both servers wrote theirs."""
    while not pidfile.exists() or len(pidfile.read_text().split()) < 2:
        assert run.poll() is None, run.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the MCP servers did not start within 60 s"
        time.sleep(0.05)
    return [int(line) for line in pidfile.read_text().split()]


def test_runs_stopped_by_sigterm_and_sigint_leave_no_server_running(tmp_path: Path):
    """Two runs at once, their episodes under way; SIGTERM stops one (143), SIGINT the other
    (130), and every server process of both is gone."""
    with FakeInferenceServer(responder=always_calls) as fake:
        runs = {sig: start_run(tmp_path, sig.name.lower(), fake.base_url) for sig in (
            signal.SIGTERM, signal.SIGINT
        )}  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            pids = {
                sig: wait_for_pids(run, pidfile, deadline) for sig, (run, pidfile) in runs.items()
            }
            while fake.requests.total() < 8:  # episodes are running in both
                assert time.monotonic() < deadline, "no episodes within 60 s"
                time.sleep(0.05)
            assert not any(gone(pid) for found in pids.values() for pid in found)
            for sig, (run, _) in runs.items():
                run.send_signal(sig)
            for sig, (run, _) in runs.items():
                status = run.wait(timeout=30)
                assert status == 128 + sig, run.communicate()[1].decode()[-2000:]
        finally:
            for run, _ in runs.values():
                if run.poll() is None:
                    run.kill()
                    run.wait()
    assert all(gone(pid) for found in pids.values() for pid in found)
