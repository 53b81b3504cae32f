"""The stdio transport of `mcp_tools`: an MCP server run as a child process, spoken to over its
stdin and stdout, for `mcp.Client` (which takes any transport: an async context manager giving
its read and write streams).

Ours rather than the SDK's `stdio_client` because the environment must know what it started:
the process id (to stop its process group, and for the tests to see it gone), its exit status
and the tail of its stderr (to say why a server failed). The server runs in a session of its
own, so a Ctrl-C at the terminal reaches the environment only, which stops its servers itself:
stdin closed, `stop_grace` seconds to exit, then SIGTERM to its process group, then SIGKILL.
A process still registered when the interpreter exits (a run that never reached its close) is
killed by an `atexit` hook. Nothing here survives a SIGKILL of the environment itself.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ServerProcess", "kill_group", "stdio_transport"]

_POLL = 0.02  # seconds between looks at a stopping process
_live: dict[int, str] = {}  # pid -> server name, for the atexit hook


@dataclass
class ServerProcess:
    """What the environment knows of one server process.

    Attributes:
        name: the server's name in the config (with `#i` for its i-th instance past the first).
        pid: the process id once it started (its process group's id too).
        returncode: its exit status once it has exited (negative: killed by that signal).
        stderr: the last lines it wrote to stderr.
        ended: set when its stdout closes (it exited, or is about to).
    """

    name: str
    pid: int | None = None
    returncode: int | None = None
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40))
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # its stdout closed

    def stderr_tail(self, lines: int = 12) -> str:
        """Its last `lines` stderr lines, one string ("(nothing)" when it wrote none)."""
        tail = list(self.stderr)[-lines:]
        return "\n".join(tail) if tail else "(nothing)"

    def describe_exit(self) -> str:
        """How it ended: exited with status N, was killed by signal N, is still running, or
        never started."""
        code = self.returncode
        if self.pid is None:
            return "never started"
        if code is None:
            return "is still running"
        return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


def kill_group(pid: int, sig: int) -> bool:
    """Send `sig` to the process group `pid` leads; False when the group is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: the group still exists
        return True
    return True


@atexit.register
def _kill_leftovers() -> None:
    """Kill the process groups of servers whose run never reached its close."""
    for pid in list(_live):
        kill_group(pid, signal.SIGKILL)
    _live.clear()


@contextlib.asynccontextmanager
async def stdio_transport(
    command: list[str],
    env: dict[str, str],
    cwd: str | None,
    process_info: ServerProcess,
    stop_grace: float = 2.0,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start `command` and bridge its stdin/stdout (one JSON-RPC message a line) to the two
    memory streams `mcp.Client` reads and writes; stop it on the way out (module docstring).

    Raises:
        OSError: the command could not be started (not found, not executable, bad cwd).
    """
    import anyio

    process = await anyio.open_process(command, env=env, cwd=cwd, start_new_session=True)
    process_info.pid = process.pid
    _live[process.pid] = process_info.name
    to_client, from_server = anyio.create_memory_object_stream[Any](0)
    to_server, from_client = anyio.create_memory_object_stream[Any](0)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_stdout, process, to_client, process_info)
            tasks.start_soon(_write_stdin, process, from_client)
            tasks.start_soon(_read_stderr, process, process_info)
            try:
                yield from_server, to_server
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, stop_grace, process_info)
                tasks.cancel_scope.cancel()
    finally:
        for stream in (to_client, from_server, to_server, from_client):
            stream.close()
        _live.pop(process.pid, None)


async def _read_stdout(process: Any, sink: Any, info: ServerProcess) -> None:
    """Each stdout line, parsed as a JSON-RPC message, to the client (a bad line is handed on
    as the exception, which the session reports); at end of file the stream closes and
    `info.ended` is set."""
    import anyio
    import mcp_types
    from anyio.streams.text import TextReceiveStream
    from mcp.shared.message import SessionMessage

    buffer = ""
    async with sink:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in TextReceiveStream(process.stdout, errors="replace"):
                *lines, buffer = (buffer + chunk).split("\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(
                            line, by_name=False
                        )
                    except ValueError as err:
                        await sink.send(err)
                        continue
                    await sink.send(SessionMessage(message))
    info.ended.set()


async def _write_stdin(process: Any, source: Any) -> None:
    """Each message from the client to the server's stdin, as one JSON line."""
    import anyio

    async with source:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for item in source:
                text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((text + "\n").encode())


async def _read_stderr(process: Any, info: ServerProcess) -> None:
    """Keep the server's last stderr lines (and keep its stderr pipe from filling up)."""
    import anyio
    from anyio.streams.text import TextReceiveStream

    buffer = ""
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        async for chunk in TextReceiveStream(process.stderr, errors="replace"):
            *lines, buffer = (buffer + chunk).split("\n")
            info.stderr.extend(line.rstrip() for line in lines if line.strip())
    if buffer.strip():
        info.stderr.append(buffer.rstrip())


async def _stop(process: Any, grace: float, info: ServerProcess) -> None:
    """Close stdin and wait `grace` s for the server to exit; then SIGTERM its process group,
    `grace` s more, then SIGKILL (and a last short wait for the kill to be seen)."""
    import anyio

    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and not kill_group(process.pid, sig):
            break
        if await _exited(process, grace if sig != signal.SIGKILL else 1.0):
            break
    info.returncode = process.returncode
    # the leader is gone; what it started in its group goes with it
    kill_group(process.pid, signal.SIGKILL)


async def _exited(process: Any, seconds: float) -> bool:
    """Whether `process` exits within `seconds` (its return code polled: `wait()` would also
    wait for its pipes to close, which a child holding them can keep open)."""
    import anyio

    deadline = anyio.current_time() + seconds
    while process.returncode is None:
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(_POLL)
    return True
