"""The proxy's route handlers: sessions, the four APIs, upstream's proxy routes.

Each handler takes a Starlette `Request` and returns a `Response`; `Routes.guard` wraps one with
the API's browser rules and turns a `ProxyError` into its status in the API's error shape, an
inference server's failure into the status that says whose it is (`inference_failure`), and
anything else (a bug) into a logged 500 (`atropos.proxy.asgi` dispatches to them). JSON is read
with `fields.decode` and written with msgspec.
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec
from jinja2 import TemplateError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from atropos.inference.errors import InferenceError
from atropos.proxy import anthropic_api, fields, openai_api, responses_api
from atropos.proxy.session import Limits, Session
from atropos.proxy.turns import ProxyError

if TYPE_CHECKING:
    from atropos.proxy.app import Proxy

__all__ = ["ErrorShape", "Handler", "Routes", "json_response"]

log = logging.getLogger("atropos.proxy")
Handler = Callable[[Request], Awaitable[Response]]
ErrorShape = Callable[[ProxyError], dict[str, Any]]
_JSON = msgspec.json.Encoder()
_PASSED_ON = {  # the error type of an inference server's 4xx, passed on to the client
    400: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def json_response(doc: Any, status: int = 200) -> Response:
    """`doc` as a JSON response (msgspec: several times faster than the json module)."""
    return Response(_JSON.encode(doc), status, media_type="application/json")


def _header(request: Request, name: bytes) -> str | None:
    """The request's first `name` header (lowercase, as ASGI gives them), read from the scope's
    list: Starlette's `request.headers.get` builds a `Headers` and raises a KeyError inside for
    a header that is absent, a few microseconds a call on every request."""
    for key, value in request.scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _key_of(request: Request) -> str | None:
    auth = _header(request, b"authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return _header(request, b"x-api-key") or None


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (`fields.decode`); ProxyError 413 past `limit` bytes."""
    return fields.decode(await _body(request, limit))


async def _body(request: Request, limit: int) -> bytes:
    """The body's bytes, read from the ASGI messages as they come (one message for a body of
    a few KiB); ProxyError 413 past `limit` bytes."""
    declared = _header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body over {limit} bytes (max_body_bytes)")
    receive, data = request.receive, bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise ClientDisconnect()
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if data or more:  # in pieces: gathered (the whole body at once is decoded as it came)
            data += chunk
        if len(data or chunk) > limit:
            raise ProxyError(413, f"request body over {limit} bytes (max_body_bytes)")
        if not more:
            return bytes(data) if data else bytes(chunk)


def inference_failure(err: InferenceError) -> ProxyError:
    """What the client hears of a failed inference call: the server's own 4xx as that status
    (its message kept), unless it is about the proxy's configuration (`err.fatal`: the server
    refused the proxy's key, does not serve its model); a timeout 504; anything else (the
    server unreachable, failing, answering what cannot be read) 502."""
    status = err.status_code
    if status is not None and 400 <= status < 500 and not err.fatal:
        kind = _PASSED_ON.get(status, "invalid_request_error")
        return ProxyError(status, f"the inference server refused the request: {err.message}", kind)
    if err.kind == "timeout":
        return ProxyError(
            504, f"the inference server did not answer: {err.message}", "timeout_error"
        )
    return ProxyError(502, f"the inference server call failed: {err.message}", "api_error")


def _loggable(request: Request) -> str:
    """The request's path for a log line: upstream's `uuid` (a secret) left out."""
    path = request.url.path
    uuid = request.path_params.get("uuid")
    return path.replace(uuid, "{uuid}") if uuid else path


def _sse(events: Iterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


class Routes:
    """The route handlers, bound to one proxy."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    # --- access ---

    def _admin(self, request: Request) -> bool:
        key = self.proxy.settings.api_key
        given = _key_of(request)
        return key is not None and given is not None and hmac.compare_digest(given, key)

    def require_admin(self, request: Request) -> None:
        if self.proxy.settings.api_key is not None and not self._admin(request):
            raise ProxyError(401, "missing or wrong API key (the proxy's --api-key)", "auth")

    def require_key(self, request: Request) -> None:
        """The proxy's key, which must be set (a route no session's key may use)."""
        if self.proxy.settings.api_key is None:
            raise ProxyError(
                401,
                "this proxy has no --api-key, so no one may list its sessions: each is reached"
                " with the api_key it was created with",
                "auth",
            )
        self.require_admin(request)

    def session_for(self, request: Request, session_id: str | None) -> Session:
        """The session a request is for: by its path id (key: the session's or the proxy's),
        by its `X-Session-ID` header (an id or an alias; the proxy's key), else by its bearer
        key."""
        given = _key_of(request)
        named = _header(request, b"x-session-id")
        if session_id is None and named and self._admin(request):
            return self.proxy.by_name(named)
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
        """`fn`, with its failures in `error`'s shape: a ProxyError its status, an inference
        failure its status (`inference_failure`), a bug a logged 500. The browser rules and
        the body limit run before, in front of every route (`atropos.http`, `build_app`)."""

        async def route(request: Request) -> Response:
            try:
                return await fn(request)
            except ProxyError as err:
                return json_response(error(err), err.status)
            except ClientDisconnect:
                return Response(status_code=400)
            except TemplateError as err:  # e.g. "roles must alternate": the conversation's fault
                message = f"messages: the policy's chat template refused them: {err}"
                return json_response(error(ProxyError(400, message, param="messages")), 400)
            except InferenceError as err:
                failure = inference_failure(err)
                if failure.status >= 500:
                    log.warning("proxy: %s %s: %s", request.method, _loggable(request), err)
                return json_response(error(failure), failure.status)
            except Exception as err:  # a bug: one record, and a 500 in the dialect's shape
                log.exception("proxy: %s %s failed", request.method, _loggable(request))
                message = f"the proxy failed on this request (a bug, logged): {type(err).__name__}"
                return json_response(error(ProxyError(500, message, "api_error")), 500)

        return route

    # --- sessions ---

    async def health(self, request: Request) -> Response:
        p = self.proxy
        return json_response(
            {"status": "ok", "model": p.settings.model, "sessions": len(p.sessions)}
        )

    async def create(self, request: Request) -> Response:
        self.require_admin(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        limits = _limits(body.get("limits"), self.proxy.settings.limits)
        session = await self.proxy.create_session(limits, fields.mapping(body, "metadata"))
        root = str(request.base_url).rstrip("/")
        return json_response(
            {
                "id": session.id,
                "api_key": session.key,
                "base_url": f"{root}/s/{session.id}/v1",
                "anthropic_base_url": f"{root}/s/{session.id}",
            }
        )

    async def list_sessions(self, request: Request) -> Response:
        self.require_key(request)
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
        return json_response({"sessions": rows})

    async def trajectory(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params["sid"])
        return json_response(session.trajectory().to_dict())

    async def reward(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params["sid"])
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        value = fields.number(body, "reward", -math.inf, math.inf)
        if value is None:
            raise ProxyError(400, 'the body must be {"reward": <number>}', param="reward")
        session.reward = float(value)
        return json_response({"id": session.id, "reward": session.reward})

    async def delete(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        self.session_for(request, sid)
        self.proxy.delete(sid)
        return json_response({"status": "deleted", "id": sid})

    # --- OpenAI dialect ---

    async def models(self, request: Request) -> Response:
        sid = request.path_params.get("sid")
        if sid is not None or _key_of(request) is not None:
            self.session_for(request, sid)
        return json_response(openai_api.models_body(self.proxy.settings.model))

    async def chat(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        data = await _body(request, self.proxy.settings.max_body_bytes)
        turn, body = session.reader.read(data)  # only what the call adds to the last one
        stream, usage = openai_api.stream_flags(body)
        result = await session.complete(turn)
        if stream:
            return _sse(openai_api.chat_stream(result, usage))
        return json_response(openai_api.chat_from_turn(result))

    async def completions(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        turn = openai_api.completion_to_turn(body)
        stream, _ = openai_api.stream_flags(body)
        result = await session.complete(turn)
        if stream:
            return _sse(openai_api.completion_stream(result))
        return json_response(openai_api.completion_from_turn(result))

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
        return json_response(response)

    async def compact(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        turn = responses_api.compact_to_turn(body, session.responses)
        return json_response(responses_api.compacted(await session.complete(turn), turn))

    # --- Anthropic dialect ---

    async def messages(self, request: Request) -> Response:
        session = self.session_for(request, request.path_params.get("sid"))
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        result = await session.complete(anthropic_api.to_turn(body))
        model = str(body.get("model") or result.model)
        stop = result.choices[0].stop_sequence if result.choices else None
        if body.get("stream"):
            return _sse(anthropic_api.stream_events(result, model, stop_sequence=stop))
        return json_response(anthropic_api.from_turn(result, model, stop_sequence=stop))

    # --- upstream's ManagedServerProxy ---

    async def upstream_create(self, request: Request) -> Response:
        self.require_admin(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        parser = _tool_parser(body) or self.proxy.settings.tool_parser
        session = await self.proxy.create_session()
        session.tool_parser = parser
        return json_response(
            {
                "uuid": self.proxy.issue_capability(session.id),
                "model_name": session.model,
                "tool_parser": session.tool_parser,
                "base_url": body.get("base_url"),
                "created_at": time.time(),
                "api_key": session.key,
            }
        )

    def _upstream_session(self, request: Request) -> Session:
        """The session upstream's `uuid` (a capability, never the id) addresses; with a proxy
        key, the request also needs it or the session's key."""
        session = self.proxy.by_capability(request.path_params["uuid"])
        given = _key_of(request)
        if self.proxy.settings.api_key is not None and not self._admin(request):
            if given is None or not hmac.compare_digest(given, session.key):
                raise ProxyError(401, "missing or wrong API key", "auth")
        return session

    async def upstream_chat(self, request: Request) -> Response:
        session = self._upstream_session(request)
        body = await _json_body(request, self.proxy.settings.max_body_bytes)
        turn = openai_api.chat_to_turn(body)
        openai_api.stream_flags(body)  # upstream answers whole, but a malformed flag is a 400
        result = await session.complete(turn)
        return json_response(openai_api.chat_from_turn(result))

    async def upstream_nodes(self, request: Request) -> Response:
        session = self._upstream_session(request)
        nodes = session.managed.nodes if session.managed is not None else []
        return json_response({"nodes": [n.to_dict() for n in nodes]})

    async def upstream_delete(self, request: Request) -> Response:
        session = self._upstream_session(request)
        self.proxy.delete(session.id)
        return json_response({"status": "deleted", "uuid": request.path_params["uuid"]})


def _tool_parser(body: Mapping[str, Any]) -> str | None:
    """`tool_parser` of upstream's `/sessions/create`: one of `PARSERS`, when given."""
    from atropos.inference.tool_calls import PARSERS

    name = fields.string(body, "tool_parser")
    if name and name not in PARSERS:
        raise ProxyError(
            400,
            f"tool_parser: expected one of {', '.join(sorted(PARSERS))}, got {fields.shown(name)}",
            param="tool_parser",
        )
    return name


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
