"""The MCP servers of one `mcp_tools` process: started (or connected to) once, shared by every
rollout, stopped at the end.

`ToolServers.start` starts each configured server (`instances` processes of it), finishes the
MCP handshake and lists its tools, within `start_timeout` seconds; a server that fails is one
`ConfigError` naming it, what happened and the tail of its stderr, and the servers already up
are stopped first. Each process is held by a task of its own (the SDK's sessions must be
entered and left in one task) and takes calls from any rollout: at once when its server is
`concurrent`, else one call at a time, the calls waiting for a free instance.

A server with a `url` is not ours to start or stop: its "start" is connecting (streamable HTTP,
or HTTP+SSE), the handshake and tools/list, within the same `start_timeout`, `instances`
sessions to it; a refused connection, an HTTP error status (401 for a bad token, 404 for a
wrong path) or a timeout is the same one `ConfigError`, naming the server and its URL (never
its headers). Its "stop" closes its sessions; `ToolServers.pids` lists no process for it.

A tool is offered under its own name, or `SERVER__TOOL` when two servers expose the same name
(`prefix_tools`: auto, always, never). What a call returns is text for a tool turn; an error
the server reports (bad arguments, a tool that failed, an unknown tool) is text too, fed back
to the policy. A server that stops answering (a call past `call_timeout`, a closed connection,
an exited process, an HTTP error status from a url server) raises `ToolServerError`: an
infrastructure failure, which fails the group instead of scoring it. A process that died is
started again at the next call to it (a url server's lost session: a new session opened), up
to `restarts` times per server (`--env.server_restarts`).

>>> exposed_names({"a": ["add", "look"], "b": ["look"]}, "auto")
{('a', 'add'): 'add', ('a', 'look'): 'a__look', ('b', 'look'): 'b__look'}
>>> exposed_names({"a": ["add"]}, "always")
{('a', 'add'): 'a__add'}
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atropos.environments.mcp_tools.config import MCPServerSpec
from atropos.environments.mcp_tools.http_transport import HttpWatch, http_transport
from atropos.environments.mcp_tools.transport import ServerProcess, stdio_transport
from atropos.envs.config import ConfigError

__all__ = [
    "SEPARATOR",
    "Connection",
    "Tool",
    "ToolReply",
    "ToolServerError",
    "ToolServers",
    "exposed_names",
    "result_text",
]

log = logging.getLogger("atropos.env")

SEPARATOR = "__"  # between a server's name and its tool's in a prefixed name
_CLOSED = -32000  # JSON-RPC code the SDK gives a request whose connection closed
_HTTP_HINTS = {  # what to check after an HTTP error status at the handshake
    401: " (check its `headers`: a token missing or wrong?)",
    403: " (check its `headers`: a token missing or wrong?)",
    404: " (check the URL's path, e.g. /mcp, or /sse for `transport: sse`)",
    405: " (check the URL's path and its `transport`)",
}


class ToolServerError(RuntimeError):
    """An MCP server stopped answering: an infrastructure failure, not the policy's (the
    rollout is `failed/tool_server`, `atropos.envs.outcome`)."""

    failure_kind = "tool_server"


@dataclass(frozen=True)
class Tool:
    """A tool as the policy sees it: `name` (perhaps prefixed), which `server` has it under
    which `remote` name, its `description` and `parameters` (its input JSON schema)."""

    name: str
    server: str
    remote: str
    description: str
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (what chat templates and `<tools>` blocks show)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolReply:
    """What one call gave the policy: the tool turn's `text`, and whether it was an `error`."""

    text: str
    error: bool = False


def exposed_names(
    by_server: Mapping[str, Sequence[str]], prefix: str
) -> dict[tuple[str, str], str]:
    """The name each server's tool is offered under (module docstring).

    Raises:
        ConfigError: a name two servers share, with `prefix` "never".
    """
    counts = collections.Counter(name for names in by_server.values() for name in set(names))
    shared = sorted(name for name, n in counts.items() if n > 1)
    if shared and prefix == "never":
        raise ConfigError(
            f"MCP servers share tool names {shared}: set --env.prefix_tools auto (or always)"
            " to offer them as SERVER__TOOL"
        )
    return {
        (server, name): (
            f"{server}{SEPARATOR}{name}" if prefix == "always" or name in shared else name
        )
        for server, names in by_server.items()
        for name in names
    }


def result_text(result: Any, max_chars: int) -> ToolReply:
    """A `CallToolResult` as a tool turn: its text blocks (other blocks named, e.g. `[image:
    image/png]`), else its structured content as JSON; "error: " first when `is_error`;
    cut to `max_chars` with a note of how much was cut.

    >>> from types import SimpleNamespace as R
    >>> block = R(type="text", text="12.5")
    >>> result_text(R(content=[block], structured_content=None, is_error=False), 100)
    ToolReply(text='12.5', error=False)
    >>> result_text(R(content=[], structured_content={"a": 1}, is_error=True), 8)
    ToolReply(text='error: {... [cut 7 characters]', error=True)
    """
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(str(block.text))
        else:
            parts.append(f"[{kind}: {getattr(block, 'mime_type', None) or 'not shown'}]")
    text = "\n".join(parts)
    if not text and getattr(result, "structured_content", None) is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    error = bool(getattr(result, "is_error", False))
    if error:
        text = "error: " + (text or "the tool failed")
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... [cut {len(text) - max_chars} characters]"
    return ToolReply(text, error)


def _environment(spec: MCPServerSpec) -> dict[str, str]:
    """The server's environment: this process's whole one with `inherit_env`, else the SDK's
    short safe list (HOME, PATH, ...), then `spec.env` over it."""
    from mcp.client.stdio import get_default_environment

    base = dict(os.environ) if spec.inherit_env else get_default_environment()
    return {**base, **{name: value.get_secret_value() for name, value in spec.env.items()}}


class Connection:
    """One MCP session, held open by a task of its own: with a server process we started
    (`command`), or with a server already running at a URL (`url`)."""

    def __init__(self, spec: MCPServerSpec, label: str) -> None:
        self.spec = spec
        self.process = ServerProcess(label)  # a url server's: never started
        self._client: Any = None
        self._ready: asyncio.Future[list[Any]] | None = None
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._grace = 2.0
        self._timeout = 30.0
        self._watch = HttpWatch()  # a url server's current session
        self._lost: str | None = None  # why a url server's last session ended by itself
        # every process started for it, the current one last (none for a url server)
        self.history = [] if self.remote else [self.process]

    @property
    def label(self) -> str:
        """The server's name (`NAME#i` for its i-th instance past the first)."""
        return self.process.name

    @property
    def remote(self) -> bool:
        """Whether it is a server at a URL (not a process of ours)."""
        return self.spec.url is not None

    async def start(self, timeout: float, stop_grace: float) -> list[Any]:
        """Start the process (or connect to the URL), shake hands, list its tools (the SDK's
        `Tool` objects).

        Raises:
            ConfigError: it could not start (or be reached), or did not get that far within
                `timeout` s.
        """
        self._ready = asyncio.get_running_loop().create_future()
        self._timeout, self._grace = timeout, stop_grace
        self._task = asyncio.create_task(self._hold(stop_grace), name=f"mcp:{self.label}")
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise ConfigError(
                self._failed(
                    f"did not finish the MCP handshake and tools/list within {timeout:g} s"
                )
            ) from None
        except Exception as err:
            await self.stop()
            raise ConfigError(self._failed(self._start_failure(err))) from None

    def _start_failure(self, err: Exception) -> str:
        """What went wrong in a start that raised `err`."""
        if not self.remote:
            if isinstance(err, OSError):
                return f"could not be started ({err})"
            return f"failed to start: {_reason(err)}"
        if self._watch.status is not None:
            hint = _HTTP_HINTS.get(self._watch.status, "")
            return f"{self._watch.failure} during the MCP handshake{hint}"
        if _innermost(err).__class__.__module__.startswith("httpx"):
            return f"could not be reached ({_reason(err)}): is it running, at that URL?"
        return f"failed to start: {_reason(err)}"

    def _failed(self, what: str) -> str:
        if self.remote:  # no process, no stderr; never the headers
            lost = f" ({self._lost})" if self._lost and self._lost not in what else ""
            return f"MCP server {self.label!r} ({self.spec.where}) {what}{lost}"
        return (
            f"MCP server {self.label!r} ({self.spec.where}) {what}; its process"
            f" {self.process.describe_exit()}; its stderr ended with:\n"
            f"{self.process.stderr_tail()}"
        )

    def describe_end(self) -> str:
        """How its last session ended: its process's exit, or a url server's lost session."""
        return "lost its session" if self.remote else self.process.describe_exit()

    def _transport(self, stop_grace: float) -> tuple[Any, asyncio.Event]:
        """The transport for `mcp.Client`, and the event set when it ends by itself."""
        spec = self.spec
        if spec.url is not None:
            self._watch, self._lost = HttpWatch(), None
            headers = {name: value.get_secret_value() for name, value in spec.headers.items()}
            transport = http_transport(
                spec.url, headers, spec.transport, self._timeout, self._watch
            )
            return transport, self._watch.ended
        command = [spec.command or "", *spec.args]
        env = _environment(spec)
        transport = stdio_transport(command, env, spec.cwd, self.process, stop_grace)
        return transport, self.process.ended

    async def _hold(self, stop_grace: float) -> None:
        """Open the session, publish the tools, and keep it open until `stop()` (or until the
        server closes its stdout, or a url server's session fails)."""
        ready = self._ready
        assert ready is not None  # set by start() before this task runs
        try:
            from mcp import Client

            transport, ended = self._transport(stop_grace)
            async with Client(transport, mode=self.spec.protocol, cache=None) as client:
                tools = await _list_tools(client)
                self._client = client
                ready.set_result(tools)
                await _first(self._stopping.wait(), ended.wait())
                if not self._stopping.is_set():
                    self._client = None
                    if self.remote:
                        self._lost = self._watch.failure
                        log.error("MCP server %r %s: closing its session", self.label, self._lost)
                    else:
                        log.error("MCP server %r closed its stdout: stopping it", self.label)
        except asyncio.CancelledError:
            ready.cancel()
            raise
        except Exception as err:  # an exception group from the SDK's task groups, too
            if not ready.done():
                ready.set_exception(err)
            elif not self._stopping.is_set():
                if self.remote:
                    self._lost = self._watch.failure or _reason(err)
                log.error("MCP server %r stopped: %s", self.label, _reason(err))
        finally:
            self._client = None
            if not ready.done():  # KeyboardInterrupt and the like
                ready.cancel()

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """`tools/call` of `name` (the server's own name) with `arguments`: the result, or an
        `MCPError` the server answered with.

        Raises:
            ToolServerError: no answer within `timeout` s, or the server is gone.
        """
        from mcp import MCPError

        client = self._client
        if client is None:
            raise await self._gone(f"is gone (tools/call {name!r} not sent)")
        try:
            return await asyncio.wait_for(client.call_tool(name, arguments), timeout)
        except asyncio.TimeoutError:
            raise ToolServerError(
                f"MCP server {self.label!r} did not answer tools/call {name!r} within"
                f" {timeout:g} s (--env.call_timeout)"
            ) from None
        except MCPError as err:
            failure = self._watch.failure if self.remote else None
            if failure is not None:  # an HTTP error status, not the tool's answer
                raise await self._gone(f"{failure} to tools/call {name!r}") from None
            if err.code != _CLOSED:
                raise
        raise await self._gone(f"closed the connection during tools/call {name!r}")

    async def _gone(self, what: str) -> ToolServerError:
        """The error for a server that went away, once its process's end is known (the wait
        bounded by its stop rule)."""
        task = self._task
        if task is not None:
            await asyncio.wait({task}, timeout=self._grace * 3 + 1)
        return ToolServerError(self._failed(what))

    @property
    def dead(self) -> bool:
        """Whether its process went away by itself (not stopped by `stop()`)."""
        task = self._task
        return task is not None and task.done() and not self._stopping.is_set()

    async def restart(self) -> None:
        """Start a new process after the last one died (a url server: open a new session
        after the last one was lost), as `start` did the first.

        Raises:
            ConfigError: it could not start (this connection is then stopped for good).
        """
        if not self.remote:
            self.process = ServerProcess(self.process.name)
            self.history.append(self.process)
        await self.start(self._timeout, self._grace)

    async def stop(self) -> None:
        """Close the session and stop the process (the transport's stop rule; a url server's
        session gets `stop_grace` s to close); idempotent."""
        self._stopping.set()
        task = self._task
        if task is None or task.done():
            return
        if self._ready is not None and not self._ready.done():
            task.cancel()  # still in the handshake, which waits for nothing we control
        if self.remote:
            await asyncio.wait({task}, timeout=self._grace)
            task.cancel()  # a server that does not answer the session's end
        await asyncio.wait({task})


def _innermost(err: BaseException) -> BaseException:
    """The first innermost error of an exception group (from the SDK's task groups), else
    `err`."""
    inner = getattr(err, "exceptions", None)
    while inner:
        err = inner[0]
        inner = getattr(err, "exceptions", None)
    return err


def _reason(err: BaseException) -> str:
    """An error in one line: the innermost of an exception group's, else its own text."""
    err = _innermost(err)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


async def _first(*waits: Any) -> None:
    """Wait until the first of `waits` (coroutines) is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _list_tools(client: Any) -> list[Any]:
    """Every tool the server lists, page after page (at most 100 pages)."""
    tools: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


class _Server:
    """The instances of one configured server, and the rule for picking one for a call."""

    def __init__(self, spec: MCPServerSpec, restarts: int) -> None:
        self.spec = spec
        self.restarts_left = restarts
        self._restarting = asyncio.Lock()
        self.connections = [
            Connection(spec, spec.name if i == 0 else f"{spec.name}#{i}")
            for i in range(spec.instances)
        ]
        self._turns = itertools.cycle(self.connections)
        self._idle: asyncio.Queue[Connection] = asyncio.Queue()
        for connection in self.connections:
            self._idle.put_nowait(connection)

    def _next_in_turn(self) -> Connection:
        """The next instance in turn; past a dead one when no restarts are left and another
        still runs."""
        connection = next(self._turns)
        if connection.dead and self.restarts_left <= 0:
            return next((c for c in self.connections if not c.dead), connection)
        return connection

    async def _revived(self, connection: Connection) -> Connection:
        """`connection`, started again first when its process died and restarts are left
        (the call that found it dead failed; the calls after it need not)."""
        if not connection.dead or self.restarts_left <= 0:
            return connection
        async with self._restarting:
            if connection.dead and self.restarts_left > 0:
                self.restarts_left -= 1
                log.warning(
                    "MCP server %r %s: %s (%d restarts left)",
                    connection.label,
                    connection.describe_end(),
                    "opening a new one" if connection.remote else "restarting it",
                    self.restarts_left,
                )
                try:
                    await connection.restart()
                except ConfigError as err:
                    raise ToolServerError(str(err)) from None
        return connection

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if self.spec.concurrent:
            connection = await self._revived(self._next_in_turn())
            return await connection.call(name, arguments, timeout)
        try:
            connection = await asyncio.wait_for(self._idle.get(), timeout)
        except asyncio.TimeoutError:
            raise ToolServerError(
                f"no instance of MCP server {self.spec.name!r} was free for tools/call"
                f" {name!r} within {timeout:g} s ({self.spec.instances} instances, one call"
                " at a time each: raise its `instances`)"
            ) from None
        try:
            return await (await self._revived(connection)).call(name, arguments, timeout)
        finally:
            self._idle.put_nowait(connection)


class ToolServers:
    """Every configured MCP server, started; their tools; calls routed to them."""

    def __init__(self, specs: Sequence[MCPServerSpec], restarts: int = 3) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"--env.servers: two servers share a name ({names})")
        self.servers = {spec.name: _Server(spec, restarts) for spec in specs}
        self.tools: dict[str, Tool] = {}

    @property
    def connections(self) -> list[Connection]:
        """Every server process's connection."""
        return [c for server in self.servers.values() for c in server.connections]

    @property
    def pids(self) -> list[int]:
        """The process ids of every server process started (running or not, restarts too);
        none for url servers, which we do not start."""
        return [p.pid for c in self.connections for p in c.history if p.pid is not None]

    async def start(self, timeout: float, stop_grace: float, prefix: str) -> None:
        """Start every server (module docstring); the first failure stops the others.

        Raises:
            ConfigError: a server that did not start, instances of one server that list
                different tools, shared names with `prefix` "never", or no tools at all.
        """
        try:
            listed = await asyncio.gather(*(c.start(timeout, stop_grace) for c in self.connections))
            self.tools = self._tool_table(dict(zip(self.connections, listed, strict=True)), prefix)
        except BaseException:
            await self.stop()
            raise

    def _tool_table(self, listed: dict[Connection, list[Any]], prefix: str) -> dict[str, Tool]:
        by_server: dict[str, list[Any]] = {}
        for connection, tools in listed.items():
            first = by_server.setdefault(connection.spec.name, tools)
            if sorted(t.name for t in first) != sorted(t.name for t in tools):
                raise ConfigError(
                    f"the instances of MCP server {connection.spec.name!r} list different tools"
                )
        names = exposed_names({s: [t.name for t in ts] for s, ts in by_server.items()}, prefix)
        table = {
            names[server, t.name]: Tool(
                names[server, t.name], server, t.name, t.description or "", dict(t.input_schema)
            )
            for server, tools in by_server.items()
            for t in tools
        }
        if not table:
            raise ConfigError(f"the MCP servers {sorted(by_server)} list no tools")
        return table

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI function schema of every tool, sorted by name."""
        return [self.tools[name].schema() for name in sorted(self.tools)]

    async def call(self, name: str, arguments: Any, timeout: float, max_chars: int) -> ToolReply:
        """Run the policy's call of tool `name`: the tool turn's text (an unknown tool,
        arguments that are not an object and errors the server reports are error text).

        Raises:
            ToolServerError: the server stopped answering (module docstring).
        """
        from mcp import MCPError

        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools))
            return ToolReply(
                f"error: there is no tool named {name!r}; the tools are: {known}", True
            )
        if not isinstance(arguments, dict):
            return ToolReply(f"error: the arguments of {name!r} must be a JSON object", True)
        try:
            result = await self.servers[tool.server].call(tool.remote, arguments, timeout)
        except MCPError as err:
            return ToolReply(f"error: {err.message}"[:max_chars], True)
        return result_text(result, max_chars)

    async def stop(self) -> None:
        """Stop every server process (each within its stop rule); idempotent."""
        await asyncio.gather(*(c.stop() for c in self.connections))
