"""A small async client of the Docker Engine API on its Unix socket (`DOCKER_HOST=unix://...`,
default `/var/run/docker.sock`): one HTTP/1.1 connection per request (a Unix connect costs
microseconds; nothing is pooled, so nothing is bound to an event loop or left open), and the
hijacked connection of an exec with its multiplexed stdout/stderr stream.

Why not httpx: an exec needs the connection hijacked after `101 UPGRADED` (stdin written, then
half-closed, while both streams are read), which httpx does not expose; and a client per event
loop would have to be closed by someone. Why not the `docker` SDK or CLI: not dependencies, and a
process per call is too slow for the exec path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

API = "/v1.41"  # Docker 20.10; later engines serve it too
DEFAULT_SOCKET = "/var/run/docker.sock"


class EngineError(RuntimeError):
    """The engine answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Docker engine: {status} {message}")
        self.status, self.message = status, message


def engine_socket(environ: dict[str, str] | None = None) -> str:
    """The engine's Unix socket path from `DOCKER_HOST` (default /var/run/docker.sock)."""
    host = (environ if environ is not None else os.environ).get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if not host.startswith("unix://"):
        raise EngineError(0, f"DOCKER_HOST={host!r}: only a unix:// socket is supported")
    return host.removeprefix("unix://")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def error(self) -> str:
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(self.body)["message"])
        return self.body.decode(errors="replace").strip()


class Engine:
    """The Engine API on one Unix socket."""

    def __init__(self, socket_path: str) -> None:
        self.socket = socket_path

    def url(self, path: str, query: dict[str, Any] | None = None) -> str:
        return API + path + ("?" + urlencode(query) if query else "")

    async def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        data: bytes | None = None,
        ok: tuple[int, ...] = (200, 201, 204, 304),
    ) -> Response:
        """One request; raises `EngineError` on a status outside `ok`."""
        headers = {}
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        elif data is not None:
            headers["Content-Type"] = "application/x-tar"
        reader, writer = await self._connect()
        try:
            writer.write(_head(method, self.url(path, query), headers, data, close=True))
            if data:
                writer.write(data)
            await writer.drain()
            status, response_headers = await _read_head(reader)
            response = Response(status, await _read_body(reader, response_headers))
        finally:
            writer.close()
        if status not in ok:
            raise EngineError(status, response.error())
        return response

    async def hijack(
        self, path: str, body: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """POST `body` to `path` asking for the raw stream (exec start): the connection's
        reader and writer after the engine's `101 UPGRADED`."""
        reader, writer = await self._connect()
        try:
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Connection": "Upgrade"}
            headers["Upgrade"] = "tcp"
            writer.write(_head("POST", self.url(path), headers, data, close=False) + data)
            await writer.drain()
            status, response_headers = await _read_head(reader)
            if status not in (101, 200):
                raise EngineError(
                    status, Response(status, await _read_body(reader, response_headers)).error()
                )
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.socket, limit=1 << 20)
        except OSError as error:
            raise EngineError(0, f"cannot reach {self.socket}: {error}") from error


def _head(method: str, url: str, headers: dict[str, str], data: bytes | None, close: bool) -> bytes:
    lines = [f"{method} {url} HTTP/1.1", "Host: docker", f"Content-Length: {len(data or b'')}"]
    lines += [f"{key}: {value}" for key, value in headers.items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        return bytes(body)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


def quoted(name: str) -> str:
    """A name or id as one URL path segment."""
    return quote(name, safe="")


@dataclass
class Output:
    """What an exec wrote so far: at most `cap` bytes per stream, and whether more came."""

    cap: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def keep(self, stream: int, chunk: bytes) -> None:
        into = {1: self.stdout, 2: self.stderr}.get(stream)
        if into is None:
            return
        room = self.cap - len(into)
        if len(chunk) > room:
            self.truncated = True
        into += chunk[: max(room, 0)]


async def demux(reader: asyncio.StreamReader, output: Output) -> None:
    """Read an exec's multiplexed stream to its end into `output` (frames: 1 byte stream, 3
    zero bytes, a big-endian 4-byte size, then the payload); what is past the cap is dropped.
    What was read stays in `output` if this is cancelled."""
    while True:
        try:
            header = await reader.readexactly(8)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        while size:
            chunk = await reader.read(min(size, 65_536))
            if not chunk:
                return
            size -= len(chunk)
            output.keep(stream, chunk)
