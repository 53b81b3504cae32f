"""`HttpRules`: the ASGI layer in front of every server we ship, and `server_app`, which builds
a Starlette app with it.

In front of every route, before any handler or key check, a request must pass:

1. the browser and Host rules of `origin.refusal` (DNS rebinding, cross-site pages, `Origin:
   null`, content types a page can send without a preflight): 403 or 415; a WebSocket
   handshake passes them on every path (its Origin is always checked) or is closed before it
   is accepted (403);
2. the body limit: a declared `Content-Length` over `Rules.max_body` is refused before a byte
   is read, and a chunked body is cut off there (413);
3. the last line of defence: an exception escaping the app before it answered is classified
   (`errors.classify`): what only input can provoke (too deep, not UTF-8, not JSON, a number
   out of range, a `ProtocolError`) is its 4xx, anything else a logged 500; the connection and
   the server carry on.

Every answer it gives has the dialect's error shape (`Rules.dialect`, chosen by path). Request
heads are bounded below the app, by the HTTP protocol of `atropos.http.serve` (`heads`).

A server exposes its rules as `app.http_rules` (set here and nowhere else), so a test can ask
every server we ship whether it is built with them (tests/test_http_rules.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect

from atropos.http.errors import ErrorShape, classify, openai_error
from atropos.http.origin import Refusal, Site, refusal
from atropos.wire import ProtocolError

__all__ = ["BodyTooLarge", "HttpRules", "Rules", "guard", "rules_of", "server_app"]

log = logging.getLogger("atropos.http")
Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
DEFAULT_MAX_BODY = 64 * 2**20
_WANTED = {b"host", b"origin", b"sec-fetch-site", b"content-type", b"content-length"}
_BODILESS = ("GET", "HEAD", "OPTIONS")


class BodyTooLarge(ProtocolError):
    """A body over the server's limit (413): raised from `receive` while a handler reads."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body exceeds the limit of {limit} bytes: send less", 413)


@dataclass(frozen=True)
class Rules:
    """What one server accepts: its site (Host names, trusted origins), the paths any page may
    open (GET/HEAD only), the body limit, and the error shape of each path."""

    site: Site
    open_paths: tuple[str, ...] = ("/health",)
    max_body: int = DEFAULT_MAX_BODY
    dialect: Callable[[str], ErrorShape] = field(default=lambda path: openai_error)

    @classmethod
    def loopback(cls, **options: Any) -> Rules:
        """Rules of a server on 127.0.0.1 without a key (the fixtures and fakes we ship)."""
        return cls(Site.of("127.0.0.1"), **options)


class HttpRules:
    """The rules (module docstring) as pure ASGI middleware: no per-request objects beyond a
    small header dict, so the API's and the proxy's CPU per request stays where it was."""

    def __init__(self, app: Any, rules: Rules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        headers = {
            name.decode(): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _WANTED
        }
        refused = refusal(method, path, headers, self.rules.site, self.rules.open_paths)
        if refused is None:
            refused = self._too_large(headers.get("content-length"))
        if refused is not None:
            status, message = refused
            kind = "TooLarge" if status == 413 else "Refused"
            await self._answer(send, path, status, message, kind)
            return
        if method not in _BODILESS:
            receive = self._bounded(receive)
        await self._run(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket handshake passes the Host and Origin rules of every route, with no
        open path: browsers let any page open a WebSocket to any host (no preflight, no
        CORS), so the Origin check is its only guard. A refused handshake is closed before
        it is accepted (the server answers 403) with the reason."""
        headers = {
            name.decode(): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _WANTED
        }
        refused = refusal("WEBSOCKET", scope["path"], headers, self.rules.site, ())
        if refused is None:
            await self.app(scope, receive, send)
            return
        log.info("WebSocket %s refused: %s", scope["path"], refused.message)
        await send({"type": "websocket.close", "code": 1008, "reason": refused.message[:120]})

    def _too_large(self, declared: str | None) -> Refusal | None:
        limit = self.rules.max_body
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return Refusal(413, f"a body of {declared} bytes exceeds the limit of {limit} bytes")
        return None

    def _bounded(self, receive: Receive) -> Receive:
        limit = self.rules.max_body
        seen = 0

        async def bounded() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
            return message

        return bounded

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return  # nobody is listening for an answer
        except Exception as err:
            status, message, kind = classify(err)
            if status >= 500:
                log.error("%s %s failed", scope["method"], scope["path"], exc_info=err)
            if started:  # the answer is on its way: nothing more can be said on it
                return
            await self._answer(send, scope["path"], status, message, kind)

    async def _answer(self, send: Send, path: str, status: int, message: str, kind: str) -> None:
        body = msgspec.json.encode(self.rules.dialect(path)(status, message, kind))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def server_app(
    routes: Sequence[Any],
    rules: Rules,
    *,
    middleware: Sequence[Middleware] = (),
    **options: Any,
) -> Starlette:
    """A Starlette app with `HttpRules` in front of everything else (`middleware` comes after
    them, then the routes); `options` go to Starlette (lifespan, exception_handlers, ...)."""
    stack = [Middleware(HttpRules, rules=rules), *middleware]
    app = Starlette(routes=list(routes), middleware=stack, **options)
    app.http_rules = rules  # type: ignore[attr-defined]
    return app


def guard(app: Any, rules: Rules) -> HttpRules:
    """Any ASGI app (one not built by `server_app`) behind `HttpRules`."""
    guarded = HttpRules(app, rules)
    guarded.http_rules = rules  # type: ignore[attr-defined]
    return guarded


def rules_of(app: Any) -> Rules | None:
    """The rules a server app was built with, or None when it has none."""
    rules = getattr(app, "http_rules", None)
    return rules if isinstance(rules, Rules) else None
