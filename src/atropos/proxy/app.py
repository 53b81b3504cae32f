"""The proxy's HTTP app: sessions, the OpenAI and Anthropic dialects, upstream's proxy routes.

Routes (`KEY` is the proxy's `--api-key` when it has one; a session's own key is its bearer):

Upstream's routes are `POST /sessions/create`, `POST /{uuid}/v1/chat/completions`, `GET
/{uuid}/nodes` and `DELETE /{uuid}`.

| Route | Who | What |
|---|---|---|
| `GET /health` | anyone | `{status, model, sessions}` |
| `POST /sessions` | KEY | a new session: `{id, base_url, anthropic_base_url, api_key}` |
| `GET /sessions` | KEY | the sessions, with their counts |
| `GET /sessions/{id}/trajectory` | KEY or the session | its sequences (`Trajectory.to_dict`) |
| `POST /sessions/{id}/reward` | KEY or the session | `{"reward": float}`: the run's reward |
| `DELETE /sessions/{id}` | KEY or the session | forget it |
| `/s/{id}/v1/...` | the session (or KEY) | the dialects below, for that session |
| `/v1/...` | a session's key | the dialects below, for the session the key names |
| `POST /sessions/create`, `/{uuid}/...` | KEY when set | upstream's ManagedServerProxy |

Dialects: `chat/completions`, `completions`, `models` (`openai_api`), `responses`
(`responses_api`), `messages` (`anthropic_api`). The key is read from `Authorization: Bearer`
or Anthropic's `x-api-key`. A wrong key is 401, an unknown or expired session 404, a finished
one 410, a body over `max_body_bytes` 413, a malformed request 400; each in the dialect's error
shape, and none of them touches another session. Every route also passes the API's browser
rules (`atropos.api.origin`): no cross-site writes, no foreign `Host`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from atropos.api.origin import Site, refusal
from atropos.proxy import anthropic_api, openai_api, responses_api
from atropos.proxy.session import Limits, Session, new_session_id, new_session_key
from atropos.proxy.turns import ProxyError

__all__ = ["Proxy", "ProxySettings", "build_app"]

log = logging.getLogger("atropos.proxy")
Handler = Callable[[Request], Awaitable[Response]]
ErrorShape = Callable[[ProxyError], dict[str, Any]]


@dataclass
class ProxySettings:
    """How the proxy runs (the `proxy:` section of a config file, `--proxy.*` flags)."""

    model: str = "atropos-policy"  # the name answers carry (default: the servers' model)
    tool_parser: str = "hermes"  # how calls are read from raw output
    limits: Limits = field(default_factory=Limits)
    session_ttl: float = 3600.0  # an idle session is forgotten after this many seconds
    max_sessions: int = 4096
    max_body_bytes: int = 8 << 20
    api_key: str | None = None
    host: str = "127.0.0.1"


class Proxy:
    """The sessions and what they generate with: embeddable in any process.

    Args:
        server: a `ServerManager` (or anything with its `managed_server(tokenizer)` and
            `chat_completion`); text-only when `text_only` (every server is `server_type:
            openai`).
        tokenizer: the policy's tokenizer.
        settings: `ProxySettings`.
        server_configs: the servers' configurations (for messages only).
    """

    def __init__(
        self,
        server: Any,
        tokenizer: Any,
        settings: ProxySettings | None = None,
        *,
        text_only: bool = False,
        server_configs: list[Any] | None = None,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.settings = settings or ProxySettings()
        self.text_only = text_only
        self.server_configs = list(server_configs or [])
        self.sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}

    async def create_session(
        self, limits: Limits | None = None, metadata: Mapping[str, Any] | None = None
    ) -> Session:
        """A new session (ProxyError 503 when `max_sessions` are open)."""
        self.expire()
        if len(self.sessions) >= self.settings.max_sessions:
            raise ProxyError(
                503,
                f"{len(self.sessions)} sessions are open (max_sessions): delete finished ones",
                "overloaded_error",
            )
        managed = None
        if not self.text_only:  # the context's exit only resets it: the session just ends
            managed = await self.server.managed_server(tokenizer=self.tokenizer).__aenter__()
        session = Session(
            new_session_id(),
            new_session_key(),
            managed=managed,
            text_server=self.server if self.text_only else None,
            tokenizer=self.tokenizer,
            tool_parser=self.settings.tool_parser,
            limits=limits or self.settings.limits,
            model=self.settings.model,
            metadata=metadata,
        )
        self.sessions[session.id] = session
        self._by_key[session.key] = session
        return session

    def get(self, session_id: str) -> Session:
        """The session, or ProxyError 404."""
        session = self.sessions.get(session_id)
        if session is None:
            raise ProxyError(
                404, f"unknown or expired session {session_id!r}: POST /sessions", "not_found_error"
            )
        return session

    def by_key(self, key: str) -> Session | None:
        """The session whose key this is (compared in constant time), if any."""
        session = self._by_key.get(key)
        if session is not None and hmac.compare_digest(session.key, key):
            return session
        return None

    def delete(self, session_id: str) -> Session:
        """Forget a session; returns it (its trajectory stays readable from it)."""
        session = self.get(session_id)
        session.close()
        del self.sessions[session_id]
        self._by_key.pop(session.key, None)
        return session

    def describe_servers(self) -> list[str]:
        """Each inference server as `base_url (server_type)`."""
        configs = self.server_configs
        return [f"{c.base_url} ({c.server_type})" for c in configs] or [repr(self.server)]

    def expire(self, now: float | None = None) -> int:
        """Forget sessions idle longer than `session_ttl`; how many were."""
        now = time.monotonic() if now is None else now
        old = [
            s.id for s in self.sessions.values() if now - s.last_used > self.settings.session_ttl
        ]
        for session_id in old:
            self.delete(session_id)
        return len(old)


# ----- the app ------------------------------------------------------------------------------------


def _key_of(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body over {limit} bytes (max_body_bytes)")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise ProxyError(413, f"request body over {limit} bytes (max_body_bytes)")
    if not data:
        return {}
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ProxyError(400, f"the body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "the body must be a JSON object")
    return body


def _sse(events: Iterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


class _Routes:
    """The route handlers, bound to one proxy."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        s = proxy.settings
        self.site = Site.of(s.host, (), s.api_key is not None)

    # --- access ---

    def _admin(self, request: Request) -> bool:
        key = self.proxy.settings.api_key
        given = _key_of(request)
        return key is not None and given is not None and hmac.compare_digest(given, key)

    def require_admin(self, request: Request) -> None:
        if self.proxy.settings.api_key is not None and not self._admin(request):
            raise ProxyError(401, "missing or wrong API key (the proxy's --api-key)", "auth")

    def session_for(self, request: Request, session_id: str | None) -> Session:
        """The session a request is for: by its path id (key: the session's or the proxy's),
        else by its bearer key."""
        given = _key_of(request)
        if session_id is not None:
            session = self.proxy.get(session_id)
            ok = given is not None and hmac.compare_digest(given, session.key)
            if not ok and not self._admin(request):
                raise ProxyError(
                    401, f"missing or wrong key for session {session_id}: use its api_key", "auth"
                )
            return session
        found = self.proxy.by_key(given) if given else None
        if found is None:
            raise ProxyError(
                401,
                "no session has this key: POST /sessions, then use its api_key (or its"
                " base_url /s/{id}/v1)",
                "auth",
            )
        return found

    def guard(self, fn: Handler, error: ErrorShape = openai_api.error_body) -> Handler:
        """Browser rules, then `fn`; a ProxyError becomes its status in `error`'s shape."""

        async def route(request: Request) -> Response:
            refused = refusal(request.method, request.url.path, request.headers, self.site)
            if refused is not None:
                return JSONResponse(
                    error(ProxyError(refused.status, refused.message, "refused")), refused.status
                )
            try:
                return await fn(request)
            except ProxyError as err:
                return JSONResponse(error(err), err.status)
            except ClientDisconnect:
                return Response(status_code=400)
            except Exception as err:  # one record per failure; the client gets a 502
                log.exception("proxy: %s %s failed", request.method, request.url.path)
                message = f"the inference server call failed: {type(err).__name__}: {err}"
                return JSONResponse(error(ProxyError(502, message, "api_error")), 502)

        return route

    # --- sessions ---

    async def health(self, request: Request) -> Response:
        p = self.proxy
        return JSONResponse(
            {"status": "ok", "model": p.settings.model, "sessions": len(p.sessions)}
        )

    async def create(self, request: Request) -> Response:
        self.require_admin(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        limits = _limits(body.get("limits"), self.proxy.settings.limits)
        session = await self.proxy.create_session(limits, body.get("metadata"))
        root = str(request.base_url).rstrip("/")
        return JSONResponse(
            {
                "id": session.id,
                "api_key": session.key,
                "base_url": f"{root}/s/{session.id}/v1",
                "anthropic_base_url": f"{root}/s/{session.id}",
            }
        )

    async def list_sessions(self, request: Request) -> Response:
        self.require_admin(request)
        rows = [
            {
                "id": s.id,
                "turns": s.turns,
                "completion_tokens": s.completion_tokens,
                "finished": s.finished,
                "reward": s.reward,
            }  # fmt: skip
            for s in self.proxy.sessions.values()
        ]
        return JSONResponse({"sessions": rows})

    async def trajectory(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params["sid"])
        return JSONResponse(session.trajectory().to_dict())

    async def reward(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params["sid"])
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        value = body.get("reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProxyError(400, 'the body must be {"reward": <number>}')
        session.reward = float(value)
        return JSONResponse({"id": session.id, "reward": session.reward})

    async def delete(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        self.session_for(request, sid)
        self.proxy.delete(sid)
        return JSONResponse({"status": "deleted", "id": sid})

    # --- OpenAI dialect ---

    async def models(self, request: Request) -> Response:
        sid = request.path_params.get("sid")
        if sid is not None or _key_of(request) is not None:
            self.session_for(request, sid)
        return JSONResponse(openai_api.models_body(self.proxy.settings.model))

    async def chat(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        turn = openai_api.chat_to_turn(body)
        result = await session.complete(turn)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _sse(openai_api.chat_stream(result, usage))
        return JSONResponse(openai_api.chat_from_turn(result))

    async def completions(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        result = await session.complete(openai_api.completion_to_turn(body))
        if body.get("stream"):
            return _sse(openai_api.completion_stream(result))
        return JSONResponse(openai_api.completion_from_turn(result))

    async def responses(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        turn = responses_api.to_turn(body, session.responses)
        result = await session.complete(turn)
        response, conversation = responses_api.from_turn(result, body, turn)
        if body.get("store") is not False:  # as OpenAI's: kept for previous_response_id
            session.responses[response["id"]] = conversation
        if body.get("stream"):
            return _sse(responses_api.stream_events(response))
        return JSONResponse(response)

    # --- Anthropic dialect ---

    async def messages(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        result = await session.complete(anthropic_api.to_turn(body))
        if body.get("stream"):
            return _sse(anthropic_api.stream_events(result, str(body.get("model") or result.model)))
        return JSONResponse(anthropic_api.from_turn(result, str(body.get("model") or result.model)))

    # --- upstream's ManagedServerProxy ---

    async def upstream_create(self, request: Request) -> Response:
        self.require_admin(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        session = await self.proxy.create_session()
        parser = body.get("tool_parser") or self.proxy.settings.tool_parser
        session.tool_parser = str(parser)
        return JSONResponse(
            {
                "uuid": session.id,
                "model_name": session.model,
                "tool_parser": session.tool_parser,
                "base_url": body.get("base_url"),
                "created_at": time.time(),
                "api_key": session.key,
            }
        )

    def _upstream_session(self, request: Request) -> Session:
        session = self.proxy.get(request.path_params["uuid"])
        given = _key_of(request)
        if self.proxy.settings.api_key is not None and not self._admin(request):
            if given is None or not hmac.compare_digest(given, session.key):
                raise ProxyError(401, "missing or wrong API key", "auth")
        return session

    async def upstream_chat(self, request: Request) -> Response:
        session = self._upstream_session(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        result = await session.complete(openai_api.chat_to_turn(body))
        return JSONResponse(openai_api.chat_from_turn(result))

    async def upstream_nodes(self, request: Request) -> Response:
        session = self._upstream_session(request)
        nodes = session.managed.nodes if session.managed is not None else []
        return JSONResponse({"nodes": [n.to_dict() for n in nodes]})

    async def upstream_delete(self, request: Request) -> Response:
        session = self._upstream_session(request)
        self.proxy.delete(session.id)
        return JSONResponse({"status": "deleted", "uuid": session.id})


def _limits(value: Any, default: Limits) -> Limits:
    if value is None:
        return default
    if not isinstance(value, Mapping):
        raise ProxyError(400, "limits must be an object: {max_turns, max_tokens, max_seconds}")
    unknown = set(value) - {"max_turns", "max_tokens", "max_seconds"}
    if unknown:
        raise ProxyError(
            400, f"unknown limits {sorted(unknown)}: use max_turns, max_tokens, max_seconds"
        )
    for name, given in value.items():
        if isinstance(given, bool) or not isinstance(given, (int, float)) or given <= 0:
            raise ProxyError(400, f"limits.{name} must be a positive number")
    return replace(default, **value)


def build_app(proxy: Proxy) -> Starlette:
    """The Starlette app of `proxy`."""
    r = _Routes(proxy)
    routes = [
        Route("/health", r.guard(r.health), methods=["GET"]),
        Route("/sessions", r.guard(r.create), methods=["POST"]),
        Route("/sessions", r.guard(r.list_sessions), methods=["GET"]),
        Route("/sessions/create", r.guard(r.upstream_create), methods=["POST"]),
        Route("/sessions/{sid}/trajectory", r.guard(r.trajectory), methods=["GET"]),
        Route("/sessions/{sid}/reward", r.guard(r.reward), methods=["POST"]),
        Route("/sessions/{sid}", r.guard(r.delete), methods=["DELETE"]),
    ]
    served: dict[str, tuple[str, Handler, ErrorShape]] = {
        "models": ("GET", r.models, openai_api.error_body),
        "chat/completions": ("POST", r.chat, openai_api.error_body),
        "completions": ("POST", r.completions, openai_api.error_body),
        "responses": ("POST", r.responses, responses_api.error_body),
        "messages": ("POST", r.messages, anthropic_api.error_body),
    }
    for prefix in ("/v1", "/s/{sid}/v1"):
        for name, (method, handler, error) in served.items():
            routes.append(Route(f"{prefix}/{name}", r.guard(handler, error), methods=[method]))
    routes += [
        Route("/{uuid}/v1/chat/completions", r.guard(r.upstream_chat), methods=["POST"]),
        Route("/{uuid}/nodes", r.guard(r.upstream_nodes), methods=["GET"]),
        Route("/{uuid}", r.guard(r.upstream_delete), methods=["DELETE"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def sweep() -> None:
            while True:
                await asyncio.sleep(max(1.0, min(60.0, proxy.settings.session_ttl / 4)))
                proxy.expire()

        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"no route {request.method} {request.url.path}: see docs/proxy.md"
        return JSONResponse(openai_api.error_body(ProxyError(404, message, "not_found_error")), 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        message = f"{request.method} is not served on {request.url.path}"
        return JSONResponse(openai_api.error_body(ProxyError(405, message)), 405)

    handlers = {404: not_found, 405: not_allowed}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.proxy = proxy
    app.state.routes = r
    return app
