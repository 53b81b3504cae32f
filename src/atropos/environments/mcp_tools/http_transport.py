"""The HTTP transports of `mcp_tools`: an MCP server already running, reached at its URL over
streamable HTTP (the current MCP transport) or the legacy HTTP+SSE one, for `mcp.Client`.

The SDK's clients (`streamable_http_client`, `sse_client`) speak the protocol; ours is the HTTP
client they use: the server's `headers` (secrets: never logged, never in an error), its
timeouts, and a watch on every response. The SDK turns an HTTP error status into a generic
JSON-RPC error ("Server returned an error response"); the watch keeps what it was (`HTTP 401
Unauthorized`, `HTTP 404 Not Found`, a proxy's 502) for the error message, and ends the session,
so that the next call opens a new one. A 4xx/5xx whose body is a JSON-RPC error is the server
answering in MCP terms (a bad call), not a failed session, and is left to the SDK; except a 404
to a request in a session, which says the server no longer knows the session (it restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["SSE_READ_TIMEOUT", "HttpWatch", "http_transport"]

SSE_READ_TIMEOUT = 300.0  # seconds an open event stream may stay silent (the SDK's default)


@dataclass
class HttpWatch:
    """What the environment knows of one HTTP session.

    Attributes:
        status: the first HTTP error status it got (not a JSON-RPC error's), e.g. 401.
        failure: that status in words: "answered HTTP 401 Unauthorized".
        ended: set at that failure (the session is closed, and the next call opens another).
    """

    status: int | None = None
    failure: str | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_response(self, response: Any) -> None:
        """An httpx response hook: note an HTTP error status that is not a JSON-RPC error, and
        a 404 to a request in a session (the server forgot the session: MCP says to open a new
        one), whatever its body."""
        if response.status_code < 400:
            return
        lost = response.status_code == 404 and "mcp-session-id" in response.request.headers
        if not lost and await _is_jsonrpc_error(response):
            return
        if self.status is None:
            self.status = response.status_code
            self.failure = f"answered HTTP {response.status_code} {response.reason_phrase}"
        self.ended.set()


async def _is_jsonrpc_error(response: Any) -> bool:
    """Whether an error response's body is a JSON-RPC error (read here; httpx keeps it for the
    SDK, which reads it next)."""
    if not response.headers.get("content-type", "").lower().startswith("application/json"):
        return False
    try:
        body = json.loads(await response.aread())
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("jsonrpc") == "2.0" and "error" in body


def _client(headers: Mapping[str, str], timeout: Any, watch: HttpWatch) -> Any:
    import httpx2

    return httpx2.AsyncClient(
        headers=dict(headers), timeout=timeout, event_hooks={"response": [watch.on_response]}
    )


@contextlib.asynccontextmanager
async def http_transport(
    url: str,
    headers: Mapping[str, str],
    kind: Literal["auto", "streamable-http", "sse"],
    connect_timeout: float,
    watch: HttpWatch,
) -> AsyncIterator[tuple[Any, Any]]:
    """The read and write streams of an MCP session with the server at `url`: streamable HTTP
    (`kind` auto or streamable-http) or HTTP+SSE (`kind` sse), every request carrying `headers`,
    connections and writes given `connect_timeout` seconds, every response seen by `watch`.

    Raises:
        httpx2.TransportError: the server could not be reached (refused, unresolved, timed out),
            from the SDK's task group (inside an exception group).
    """
    import httpx2

    timeout = httpx2.Timeout(connect_timeout, read=SSE_READ_TIMEOUT)
    if kind == "sse":
        from mcp.client.sse import sse_client

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            client: httpx2.AsyncClient = _client(headers or {}, timeout, watch)
            return client

        sse = sse_client(
            url,
            headers=dict(headers),
            timeout=connect_timeout,
            sse_read_timeout=SSE_READ_TIMEOUT,
            httpx_client_factory=factory,
        )
        async with sse as streams:
            yield streams
        return
    from mcp.client.streamable_http import streamable_http_client

    async with _client(headers, timeout, watch) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams
