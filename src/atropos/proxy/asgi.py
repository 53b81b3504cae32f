"""The proxy's ASGI app: a request goes to its handler by the shape of its path.

The routes are few and fixed (`atropos.proxy.app` lists them), so a dispatch on the path's
parts replaces a router that tries each route's pattern in turn, and there is no middleware
stack: the handlers (`atropos.proxy.routes.Routes`, Starlette requests and responses) do their
own checks. This keeps the proxy's CPU per call small next to the server's (docs/proxy.md,
benchmarks/proxy_overhead.py). The lifespan runs the sweeper that forgets idle sessions.

The lifespan also holds a `FrozenHeap` (`atropos.envs.runner.heap`: the long-lived objects
frozen out of the collector's scans, a larger young generation), as env runners do, unless the
process already froze its heap (an env runner serving an embedded proxy holds its own). After
startup the proxy holds a few hundred thousand long-lived objects (transformers, the tokenizer)
and a full collection walked them all: at 256 sessions of 16 calls, collections were about a
quarter of the proxy's CPU (`benchmarks/proxy_overhead.py`, RESULTS.md). The heap is frozen
once more after the first request with a session open (the session's compiled chat template
exists by then).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from atropos.envs.runner.heap import FrozenHeap
from atropos.proxy import anthropic_api, openai_api, responses_api
from atropos.proxy.routes import Handler, Routes, json_response
from atropos.proxy.turns import ProxyError

if TYPE_CHECKING:
    from atropos.proxy.app import Proxy

__all__ = ["ProxyApp"]

_OWN_HEADS = frozenset({"", "v1", "s", "sessions", "health"})
Scope = dict[str, Any]
Receive = Any
Send = Any


class ProxyApp:
    """The ASGI app of one `Proxy`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        r = self.routes = Routes(proxy)
        self.state = SimpleNamespace(proxy=proxy, routes=r)
        self._fixed: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): r.guard(r.health),
            ("POST", "/sessions"): r.guard(r.create),
            ("GET", "/sessions"): r.guard(r.list_sessions),
            ("POST", "/sessions/create"): r.guard(r.upstream_create),
        }
        self._session: dict[tuple[str, str], Handler] = {  # /sessions/{sid}[/what]
            ("GET", "trajectory"): r.guard(r.trajectory),
            ("POST", "reward"): r.guard(r.reward),
            ("DELETE", ""): r.guard(r.delete),
        }
        self._apis: dict[str, tuple[str, Handler]] = {  # /v1/{name}, /s/{sid}/v1/{name}
            "models": ("GET", r.guard(r.models)),
            "chat/completions": ("POST", r.guard(r.chat)),
            "completions": ("POST", r.guard(r.completions)),
            "responses": ("POST", r.guard(r.responses, responses_api.error_body)),
            "responses/compact": ("POST", r.guard(r.compact, responses_api.error_body)),
            "messages": ("POST", r.guard(r.messages, anthropic_api.error_body)),
        }
        self._upstream: dict[tuple[str, str], Handler] = {  # /{uuid}[/what]
            ("POST", "v1/chat/completions"): r.guard(r.upstream_chat),
            ("GET", "nodes"): r.guard(r.upstream_nodes),
            ("DELETE", ""): r.guard(r.upstream_delete),
        }
        self._sweeper: asyncio.Task[None] | None = None
        self._heap: FrozenHeap | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler, params = self.match(scope["method"], scope["path"])
            scope["path_params"] = params
            response = await handler(Request(scope, receive, send))
            await response(scope, receive, send)
            heap = self._heap
            if heap is not None and not heap.settled and self.proxy.sessions:
                heap.settle()  # once: what the first calls loaded is long-lived too
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler of a request and its path parameters (a 404 or 405 handler if none)."""
        fixed = self._fixed.get((method, path))
        if fixed is not None:
            return fixed, {}
        parts = path.strip("/").split("/")
        head = parts[0]
        if head == "v1" or (head == "s" and len(parts) > 3 and parts[2] == "v1"):
            params = {} if head == "v1" else {"sid": parts[1]}
            entry = self._apis.get("/".join(parts[1:] if head == "v1" else parts[3:]))
            if entry is None:
                return self._missing(path), {}
            allowed, handler = entry
            return (handler, params) if method == allowed else (self._not_allowed(method), {})
        if head == "sessions" and len(parts) in (2, 3):
            found = self._session.get((method, parts[2] if len(parts) == 3 else ""))
            return (found, {"sid": parts[1]}) if found else (self._missing(path), {})
        if head and len(parts) <= 4:
            found = self._upstream.get((method, "/".join(parts[1:])))
            if found is not None:
                return found, {"uuid": head}
        return self._missing(path), {}

    def _missing(self, path: str) -> Handler:
        """A 404 that names the path, unless its head may be upstream's `uuid` (a secret)."""
        head = path.strip("/").split("/")[0]
        if head in _OWN_HEADS:
            message = f"no route {path}: see docs/proxy.md"
        else:
            message = (
                "no such route (upstream's are POST /{uuid}/v1/chat/completions, GET"
                " /{uuid}/nodes, DELETE /{uuid}): see docs/proxy.md"
            )
        return self._error(ProxyError(404, message, "not_found_error"))

    def _not_allowed(self, method: str) -> Handler:
        return self._error(ProxyError(405, f"{method} is not served on this path"))

    def _error(self, err: ProxyError) -> Handler:
        async def answer(request: Request) -> Any:
            return json_response(openai_api.error_body(err), err.status)

        return self.routes.guard(answer)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if gc.get_freeze_count() == 0:  # else the process holds its own FrozenHeap
                    self._heap = FrozenHeap().__enter__()
                self._sweeper = asyncio.create_task(self._sweep())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._sweeper is not None:
                    self._sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._sweeper
                if self._heap is not None:
                    self._heap.__exit__(None, None, None)
                    self._heap = None
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _sweep(self) -> None:
        """Forget idle sessions, every quarter of their time to live (1 to 60 s)."""
        while True:
            await asyncio.sleep(max(1.0, min(60.0, self.proxy.settings.session_ttl / 4)))
            self.proxy.expire()
