"""A lean HTTP/1.1 client for the inference backends: keep-alive connections, bytes in and out.

The backends make one small JSON request per generation call, thousands per second under RL
load. aiohttp spent about 100-250 us of CPU on each (request and response objects, multidicts,
timers, tracing hooks, stream readers); this client does only what the backends need and costs
a fraction of that: a pool of keep-alive connections per origin, one request at a time on each,
the request written in one call from bytes built with a single format, and the answer parsed by
`httptools` (llhttp, the parser uvicorn uses) into `(status, body, headers)`.

What it does: `http` and `https` (the default SSL context), `Content-Length`, chunked and
read-until-close bodies, `Connection: close`, a total deadline per request (connect included),
and one transparent retry when a reused keep-alive connection turns out to have been closed by
the server before any byte of the answer came back (the race every keep-alive client has with a
server's idle timeout; nothing was processed, so sending again is safe). Idle connections are
dropped after `idle_timeout` seconds, below uvicorn's (and vLLM's) 5 s keep-alive, so that race
is rare to begin with. What it does not do: redirects, proxies, cookies, compression, streaming,
`Expect: 100-continue`; none of them is used by inference servers' JSON APIs, and aiohttp did
not use proxies or cookies here either (its defaults).

Errors: `TimeoutError` when the deadline passes; `ConnectionError` (or another `OSError`) when
the server cannot be reached or drops the connection; `HTTPProtocolError` (a `ConnectionError`)
for an answer that is not HTTP. The caller maps them (`base.HTTPBackend._request`).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["HTTPClient", "HTTPProtocolError", "HTTPResponse"]


class HTTPResponse:
    """An answer: status, the whole body, and headers (names in lower case, read on demand)."""

    __slots__ = ("status", "body", "_raw", "_headers")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        raw_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self._headers = headers
        self._raw = raw_headers or []

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = {
                name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self._raw
            }
        return self._headers

    def __repr__(self) -> str:
        return f"<HTTPResponse {self.status}, {len(self.body)} bytes>"


class HTTPProtocolError(ConnectionError):
    """The server's bytes are not a valid HTTP answer (or came when none was asked for)."""


class _Stale(ConnectionError):
    """A connection closed before any byte of the answer arrived."""


class _Origin:
    """Where requests to one scheme://host:port go, and its idle connections (newest last)."""

    __slots__ = ("host", "port", "ssl", "host_header", "idle")

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, host_header: str) -> None:
        self.host, self.port, self.ssl, self.host_header = host, port, tls, host_header
        self.idle: list[_Connection] = []


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[HTTPResponse] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.body: list[bytes] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.got_bytes = False
        self.headers_done = False
        self.closed = False
        self.requests = 0  # requests sent on this connection
        self.idle_since = 0.0

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: this connection cannot be trusted
            self.abort()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPProtocolError(f"unreadable HTTP answer: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.waiter is not None and not self.waiter.done():
            if self.headers_done and not self._framed():  # a body that ends with the connection
                self._complete(keep=False)
            elif not self.got_bytes:
                self._fail(_Stale("the server closed the connection before answering"))
            else:
                self._fail(ConnectionResetError("the server closed the connection mid-answer"))
        idle = self.origin.idle
        if idle and self in idle:
            idle.remove(self)

    # --- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.waiter is None:  # an answer nobody asked for: never reuse this connection
            self.closed = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def _framed(self) -> bool:
        """Whether the answer says how long it is (Content-Length, or chunked)."""
        for name, value in self.headers:
            key = name.lower()
            if key == b"content-length":
                return True
            if key == b"transfer-encoding" and b"chunked" in value.lower():
                return True
        return False

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an informational answer: the real one follows
            self._reset()
            return
        self._complete(keep=self.parser.should_keep_alive())

    # --- exchange ---------------------------------------------------------------------------

    def _reset(self) -> None:
        self.body = []
        self.headers = []
        self.headers_done = False

    def _complete(self, *, keep: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if not keep:
            self.closed = True
        if waiter is not None and not waiter.done():
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            status = self.parser.get_status_code()
            waiter.set_result(HTTPResponse(status, body, raw_headers=self.headers))

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        self.closed = True
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _expire(self) -> None:
        self.timer = None
        self._fail(TimeoutError("no answer before the deadline"))
        self.abort()

    def send(
        self, payload: bytes, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> asyncio.Future[HTTPResponse]:
        """Write one request; the future gets its answer."""
        assert self.transport is not None
        self._reset()
        self.got_bytes = False
        self.requests += 1
        waiter: asyncio.Future[HTTPResponse] = loop.create_future()
        self.waiter = waiter
        if deadline is not None:
            self.timer = loop.call_at(deadline, self._expire)
        self.transport.write(payload)
        return waiter

    def done(self) -> None:
        """The answer was read: stop the deadline timer."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            try:
                self.transport.abort()
            except RuntimeError:  # its event loop is closed: nothing left to close
                pass


class HTTPClient:
    """Keep-alive HTTP/1.1 requests with whole bodies (see the module docstring).

    Use it from one event loop. Connections are opened on demand, without a limit (inference
    servers are sent thousands of requests at once), and reused newest first.

    Args:
        headers: sent with every request (e.g. `Authorization`), after the per-request ones.
        idle_timeout: seconds an idle connection is kept for reuse.
        connect_timeout: the longest a connection attempt may take (also bounded by the
            request's own deadline).
    """

    def __init__(
        self,
        headers: dict[str, str] | None = None,
        *,
        idle_timeout: float = 4.0,
        connect_timeout: float = 30.0,
    ) -> None:
        self.default_headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.closed = False
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._routes: dict[str, tuple[_Origin, str]] = {}
        self._heads: dict[tuple[str, str], bytes] = {}
        self._busy: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        idle = sum(len(o.idle) for o in self._origins.values())
        return f"<HTTPClient {len(self._busy)} busy, {idle} idle connections>"

    def _route(self, url: str) -> tuple[_Origin, str]:
        """The origin and request target of `url` (parsed once per URL)."""
        found = self._routes.get(url)
        if found is not None:
            return found
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s) URL, got {url!r}")
        port = parts.port or (443 if scheme == "https" else 80)
        key = (scheme, parts.hostname, port)
        origin = self._origins.get(key)
        if origin is None:
            tls = None
            if scheme == "https":
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                tls = self._ssl
            netloc = parts.netloc.rpartition("@")[2]  # no userinfo in the Host header
            origin = self._origins[key] = _Origin(parts.hostname, port, tls, netloc)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        if len(self._routes) < 1024:
            self._routes[url] = (origin, target)
        return origin, target

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | str | None = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> HTTPResponse:
        """Send one request and read the whole answer (any status).

        `headers`: a dict, or header lines already formatted (`"Name: value\\r\\n"` each).
        `deadline` (loop time, absolute) bounds it as `timeout` does, whichever comes first:
        one timer either way.

        Raises:
            TimeoutError: no whole answer within `timeout` seconds or by `deadline`
                (connecting included).
            ConnectionError, OSError: the server could not be reached or dropped the connection.

        Long because connecting, sending and reading one answer run under one deadline and share the
        connection.
        """
        if self.closed:
            raise RuntimeError("this HTTPClient is closed")
        origin, target = self._route(url)
        if headers:
            if isinstance(headers, str):
                extra = headers
            else:
                extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head = self._head(method, target, origin, extra)
        else:
            cached = self._heads.get((method, url))
            if cached is None:
                cached = self._head(method, target, origin, "")
                if len(self._heads) < 1024:
                    self._heads[(method, url)] = cached
            head = cached
        if body is None:
            payload = head + b"\r\n"
        else:
            payload = b"%bContent-Length: %d\r\n\r\n%b" % (head, len(body), body)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._forget_idle()
            self._loop = loop
        if timeout is not None:
            ends = loop.time() + timeout
            deadline = ends if deadline is None or ends < deadline else deadline
        for attempt in (1, 2):
            conn = self._idle(origin, loop) or await self._connect(origin, loop, deadline)
            reused = conn.requests > 0
            self._busy.add(conn)
            try:
                answer = await conn.send(payload, loop, deadline)
            except _Stale:
                conn.abort()
                if reused and attempt == 1:
                    continue  # the server had closed it while idle: once more, on a new one
                raise ConnectionResetError(
                    f"{method} {url}: the server closed the connection without answering"
                ) from None
            except BaseException:
                conn.abort()  # cancelled or failed mid-answer: never reuse it
                raise
            finally:
                conn.done()
                self._busy.discard(conn)
            if conn.closed or self.closed:
                conn.abort()
            else:
                conn.idle_since = loop.time()
                origin.idle.append(conn)
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _head(self, method: str, target: str, origin: _Origin, extra: str) -> bytes:
        """The request line and headers, without Content-Length and the blank line."""
        return (
            f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
            f"{extra}{self.default_headers}"
        ).encode("latin-1")

    def _idle(self, origin: _Origin, loop: asyncio.AbstractEventLoop) -> _Connection | None:
        idle = origin.idle
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                conn.abort()
                continue
            if loop.time() - conn.idle_since > self.idle_timeout:
                conn.abort()  # the newest is too old, so are the others
                for old in idle:
                    old.abort()
                idle.clear()
                return None
            return conn
        return None

    async def _connect(
        self, origin: _Origin, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> _Connection:
        wait = self.connect_timeout
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - loop.time()))
        kwargs: dict[str, Any] = {}
        if origin.ssl is not None:
            kwargs = {"ssl": origin.ssl, "server_hostname": origin.host}
        connecting = loop.create_connection(
            lambda: _Connection(origin), origin.host, origin.port, **kwargs
        )
        _, conn = await asyncio.wait_for(connecting, wait)  # rare: connections are reused
        return conn

    def _forget_idle(self) -> None:
        for origin in self._origins.values():
            for conn in origin.idle:
                conn.abort()
            origin.idle.clear()

    async def close(self) -> None:
        """Close every connection; requests in flight fail. The client cannot be used after."""
        self.closed = True
        self._forget_idle()
        for conn in list(self._busy):
            conn.abort()
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports finish closing
