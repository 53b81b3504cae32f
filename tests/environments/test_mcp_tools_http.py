"""`mcp_tools` against MCP servers reached over HTTP: the shipped fixture server served over
streamable HTTP (and legacy HTTP+SSE) as a subprocess on 127.0.0.1, each test starting its own
and stopping it by its pid. The env plays its tasks as over stdio; a bearer token works or is one
clear error (its value never shown); nothing listening, a wrong path, a server killed mid-run
(the call fails, the next one reconnects) and the config's checks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.mcp_tools import MCPTools, MCPToolsConfig
from atropos.environments.mcp_tools.config import FIXTURE_MODULE, MCPServerSpec, fixture_server
from atropos.environments.mcp_tools.servers import ToolServerError, ToolServers
from atropos.envs.config import ConfigError
from atropos.testing import free_port

from .test_mcp_tools import (
    CONVERT,
    LOOKUP,
    STOVE,
    Scripted,
    block,
    check_turns,
    group_of,
    with_env,
)

SOURCE = str(Path(__file__).resolve().parents[2] / "src")
TOKEN = "s3cret-token-value"
DATE = {"date": "2025-07-04"}  # a Friday


@dataclass
class Served:
    """A fixture server over HTTP: its process, its port, and the URL of its endpoint."""

    process: subprocess.Popen[bytes]
    port: int
    url: str


def serve(port: int, *options: str) -> Served:
    """Start the fixture server on 127.0.0.1:`port` with `options` (`--token T`, `--sse`) and
    wait, at most 15 s, until it accepts connections."""
    command = [sys.executable, "-m", FIXTURE_MODULE, "--http", str(port), *options]
    process = subprocess.Popen(
        command,
        env={"PYTHONPATH": SOURCE, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 15
    while True:
        assert process.poll() is None, process.communicate()[1].decode()[-2000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, f"the fixture HTTP server on {port}: not up in 15 s"
            time.sleep(0.05)
    path = "/sse" if "--sse" in options else "/mcp"
    return Served(process, port, f"http://127.0.0.1:{port}{path}")


def stop(served: Served) -> None:
    """Kill the server by its pid and reap it."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGKILL)
    served.process.wait(timeout=10)
    if served.process.stderr is not None:
        served.process.stderr.close()


@pytest.fixture
def http_server() -> Iterator[Callable[..., Served]]:
    """`http_server(*options, port=None)` starts a fixture HTTP server (on a free port unless
    given); every one started is killed by its pid at the end."""
    started: list[Served] = []

    def start(*options: str, port: int | None = None) -> Served:
        started.append(serve(port or free_port(), *options))
        return started[-1]

    yield start
    for served in started:
        stop(served)


def remote(url: str, name: str = "fixture", **settings: Any) -> MCPServerSpec:
    return MCPServerSpec.model_validate({"name": name, "url": url, **settings})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def started(specs: list[MCPServerSpec], restarts: int = 1, timeout: float = 10) -> Any:
    servers = ToolServers(specs, restarts)
    await servers.start(timeout=timeout, stop_grace=1, prefix="auto")
    return servers


def start_error(spec: MCPServerSpec, timeout: float = 10) -> str:
    """The ConfigError's message of starting `spec` (it must fail)."""

    async def main() -> None:
        await started([spec], timeout=timeout)

    with pytest.raises(ConfigError) as err:
        asyncio.run(main())
    return str(err.value)


# ----- the env over HTTP ---------------------------------------------------------------------


def test_the_env_plays_its_tasks_over_http_as_over_stdio(http_server):
    served = http_server()

    async def over_stdio() -> list[dict[str, Any]]:
        servers = await started([fixture_server()])
        try:
            return servers.schemas()
        finally:
            await servers.stop()

    stdio_schemas = asyncio.run(over_stdio())
    script = [  # the stdio test's group (test_mcp_tools.py)
        [LOOKUP, CONVERT, "<answer>5.29</answer>"],  # right calls, right answer: 1.0
        ["<answer>5.29</answer>"],  # a guess, no calls: 0.8
        [block("lookup_item", query="Stove"), CONVERT, "<answer>5.5</answer>"],  # 0.2 * 1/2
        [block("teleport"), '<tool_call>{"name": </tool_call>', block("teleport")],  # 3 turns
    ]

    async def scenarios(env: MCPTools, responder: Scripted) -> None:
        assert env.servers.schemas() == stdio_schemas and env.servers.pids == []
        group, episodes = await group_of(env, responder, STOVE, script)
        assert group["scores"] == pytest.approx([1.0, 0.8, 0.1, 0.0])
        check_turns(episodes)  # the same tool turns as over stdio
        assert group["token_source"] == "server"

    with_env(scenarios, max_turns=3, servers=[remote(served.url, instances=2)])


def test_the_legacy_sse_transport_and_the_legacy_handshake(http_server):
    served = http_server("--sse")

    async def main() -> None:
        servers = await started([remote(served.url, transport="sse", protocol="legacy")])
        try:
            assert (await servers.call("weekday", DATE, 10, 100)).text == "Friday"
            bad = await servers.call("weekday", {"date": "4 July"}, 10, 200)
            assert bad.error and "is not a date written YYYY-MM-DD" in bad.text
        finally:
            await servers.stop()

    asyncio.run(main())


# ----- start failures: one ConfigError naming the server and URL ---------------------------------


def test_a_bearer_token_works_and_a_missing_or_wrong_one_is_named_never_shown(http_server):
    served = http_server("--token", TOKEN)

    async def with_the_token() -> None:
        servers = await started([remote(served.url, headers=bearer(TOKEN))])
        try:
            assert (await servers.call("weekday", DATE, 10, 100)).text == "Friday"
        finally:
            await servers.stop()

    asyncio.run(with_the_token())
    for headers in ({}, bearer("wrong-token-value")):
        said = start_error(remote(served.url, "search", headers=headers))
        assert said.startswith(f"MCP server 'search' ({served.url}) answered HTTP 401")
        assert "check its `headers`" in said
        assert TOKEN not in said and "wrong-token-value" not in said
    wrong_path = served.url.replace("/mcp", "/api")
    said = start_error(remote(wrong_path, "search", headers=bearer(TOKEN)))
    assert f"({wrong_path}) answered HTTP 404 Not Found" in said and TOKEN not in said


def test_nothing_listening_is_one_error_within_the_start_timeout():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    began = time.monotonic()
    said = start_error(remote(url, "gone", headers=bearer(TOKEN)), timeout=5)
    assert time.monotonic() - began < 5
    assert said.startswith(f"MCP server 'gone' ({url}) could not be reached (ConnectError")
    assert TOKEN not in said


def test_a_failing_url_server_stops_the_servers_already_up(http_server):
    served = http_server("--token", TOKEN)
    servers = ToolServers([fixture_server(), remote(served.url, "search")])

    async def main() -> None:
        await servers.start(timeout=30, stop_grace=1, prefix="auto")

    with pytest.raises(ConfigError, match="MCP server 'search'.*HTTP 401"):
        asyncio.run(main())
    [pid] = servers.pids  # the stdio fixture's only: a url server has no process of ours
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped


# ----- a server lost mid-run ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
def test_a_server_killed_mid_run_fails_the_call_and_the_next_call_reconnects(http_server, protocol):
    """Killed: the call raises ToolServerError; started again on its port, the next call opens
    a new session. A restart the session never saw (the legacy handshake's session ids: the
    new server knows none) fails one call too, then reconnects."""
    served = http_server()

    async def main() -> None:
        servers = await started([remote(served.url, protocol=protocol)], restarts=2)
        try:
            assert (await servers.call("weekday", DATE, 10, 100)).text == "Friday"
            stop(served)
            with pytest.raises(ToolServerError, match=f"MCP server 'fixture' \\({served.url}\\)"):
                await servers.call("weekday", DATE, 10, 100)
            again = http_server(port=served.port)
            assert (await servers.call("weekday", DATE, 10, 100)).text == "Friday"
            stop(again)
            http_server(port=served.port)  # before any call noticed
            if protocol == "legacy":
                with pytest.raises(ToolServerError, match="answered HTTP 404 Not Found"):
                    await servers.call("weekday", DATE, 10, 100)
            assert (await servers.call("weekday", DATE, 10, 100)).text == "Friday"
            assert servers.pids == []
        finally:
            await servers.stop()

    asyncio.run(main())


# ----- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"command": "calc-mcp", "url": "http://127.0.0.1:1/mcp"}, "not both"),
        ({}, "give `command` (a program we start, spoken to over stdio) or `url`"),
        ({"url": "http://h/mcp", "args": ["-v"]}, "has a `url`: args are for a server we start"),
        ({"url": "http://h/mcp", "env": {"K": "v"}, "cwd": "/"}, "`url`: env, cwd are for"),
        ({"command": "calc-mcp", "headers": {"A": "b"}}, "`headers` and `transport` are for"),
        ({"url": "h:8000/mcp"}, "should match pattern '^https?://'"),
    ],
    ids=["both", "neither", "url-args", "url-env-cwd", "command-headers", "not-http"],
)
def test_a_server_spec_takes_command_or_url(given, said):
    with pytest.raises(ValueError, match=re.escape(said)) as err:
        MCPServerSpec.model_validate({"name": "calc", **given})
    assert str(err.value).startswith("1 validation error for MCPServerSpec")


def test_headers_are_secrets_kept_out_of_saved_configs_and_urls_of_passwords():
    spec = remote("https://me:pw@mcp.example.com/mcp", "search", headers=bearer(TOKEN))
    assert spec.headers["Authorization"].get_secret_value() == f"Bearer {TOKEN}"
    assert (
        spec.transport == "auto"
        and spec.command is None
        and spec.where.endswith("//mcp.example.com/mcp")
    )
    saved = json.dumps(MCPToolsConfig(servers=[spec]).model_dump(mode="json"))
    assert TOKEN not in saved and "search" in saved
    assert TOKEN not in repr(spec)
