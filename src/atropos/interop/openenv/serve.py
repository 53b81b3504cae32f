"""`atropos env publish NAME --as openenv`: a registered environment as an OpenEnv server.

The server speaks what openenv-core 0.3.0's clients (`EnvClient`, `GenericEnvClient`, TRL's
and SkyRL's integrations) use: the `/ws` WebSocket session (`reset`, `step`, `state`, `close`
messages, one episode per connection at a time), `GET /health`, `/metadata` and `/schema`.
The episodes are `atropos.interop.episodes`' (shared with ORS): `reset` starts one of the item
a seed picks (`Adapter.item`: the train split's, seed modulo their number; default: the next in
turn), `step` plays `Episode.reply`. The action is `{"message": "<the policy's reply>"}`
(`TextAction`); the observation is `{"prompt": <the text to answer>, "messages": <the
conversation so far on reset; on a step, the tool turns it added, if any>}` with `reward` (the
step's reward, 0 when it has none) and `done`. `reset` takes `seed` and `episode_id`.

Not served: openenv's stateless HTTP `POST /reset` and `/step` (they build a fresh
environment per request, so no episode can go on over them), `/mcp` and the web UI.

Built with `atropos.http.server_app` and `Rules`: Host and Origin rules on every route and
on the WebSocket handshake (which the HTTP layer does not see), the body limit, at most
`MAX_SESSIONS` sessions at once (`CAPACITY_REACHED` beyond), frames of at most 1 MiB, a
session idle for `IDLE_SECONDS` closed. Beyond loopback it needs a key (`--api-key KEY` among
the flags, or `$ATROPOS_API_KEY`), sent as `Authorization: Bearer KEY` on every route but
`/health` and on the handshake.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from atropos.http import Rules, Site, server_app
from atropos.interop.episodes import Adapter, Episode

__all__ = ["MAX_SESSIONS", "ACTION_SCHEMA", "build_app", "publish"]

MAX_SESSIONS = 64
IDLE_SECONDS = 600.0
MAX_FRAME = 2**20
ACTION_SCHEMA: dict[str, Any] = {
    "title": "TextAction",
    "type": "object",
    "properties": {
        "message": {"title": "Message", "type": "string", "description": "the policy's reply"},
        "metadata": {"type": "object", "additionalProperties": True},
    },
    "required": ["message"],
    "additionalProperties": False,
}
OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "TextObservation",
    "type": "object",
    "properties": {
        "prompt": {"type": "string"},
        "messages": {"type": "array", "items": {"type": "object"}},
        "done": {"type": "boolean"},
        "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
}
STATE_SCHEMA: dict[str, Any] = {
    "title": "State",
    "type": "object",
    "properties": {"episode_id": {"type": "string"}, "step_count": {"type": "integer"}},
}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


def _observation(prompt: str, reward: float | None, done: bool, **more: Any) -> dict[str, Any]:
    data = {"observation": {"prompt": prompt, **more}, "reward": reward, "done": done}
    return {"type": "observation", "data": data}


class Sessions:
    """The episodes being played: the adapter, the count, the seeds handed out in turn."""

    def __init__(self, name: str, adapter: Adapter, limit: int = MAX_SESSIONS) -> None:
        self.name, self.adapter, self.limit = name, adapter, limit
        self.open = 0
        self.seeds = itertools.count()

    async def handle(self, message: Any, episode: Episode | None, state: dict[str, Any]) -> Any:
        """(the answer to one message, the episode after it)."""
        kind = message.get("type") if isinstance(message, dict) else None
        data = message.get("data") if isinstance(message, dict) else None
        if kind == "reset":
            options = data if isinstance(data, dict) else {}
            seed = options.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                return _error("VALIDATION_ERROR", "seed must be an integer"), episode
            if episode is not None:
                await episode.close()
            item = self.adapter.item(next(self.seeds) if seed is None else seed)
            episode = await self.adapter.start(item)
            state.update(episode_id=str(options.get("episode_id") or uuid.uuid4()), step_count=0)
            prompt = str(episode.messages[-1]["content"])
            return _observation(prompt, None, False, messages=episode.messages), episode
        if kind == "step":
            if not isinstance(data, dict) or not isinstance(data.get("message"), str):
                return _error("VALIDATION_ERROR", 'the action is {"message": "<reply>"}'), episode
            if set(data) - {"message", "metadata"}:
                return _error("VALIDATION_ERROR", "the action has only message, metadata"), episode
            if episode is None:
                return _error("EXECUTION_ERROR", "no episode: send reset first"), episode
            step = await episode.reply(data["message"])
            state["step_count"] += 1
            more = {"messages": list(step.messages)} if step.messages else {}
            return _observation(step.text, step.reward or 0.0, step.finished, **more), episode
        if kind == "state":
            return {"type": "state", "data": dict(state)}, episode
        return _error("UNKNOWN_TYPE", f"unknown message type {kind!r}"), episode


def _keyed(headers: Any, key: str) -> bool:
    given = headers.get("authorization", "")
    return not key or hmac.compare_digest(given.encode(), f"Bearer {key}".encode())


async def _session(ws: WebSocket, sessions: Sessions, key: str) -> None:
    # Host and Origin were checked on the handshake by the HTTP rules (atropos.http)
    if not _keyed(ws.headers, key):
        await ws.close(code=1008, reason="a valid key is needed")
        return
    await ws.accept()
    if sessions.open >= sessions.limit:
        await ws.send_text(json.dumps(_error("CAPACITY_REACHED", f"{sessions.limit} sessions")))
        await ws.close()
        return
    sessions.open += 1
    episode: Episode | None = None
    state: dict[str, Any] = {"episode_id": None, "step_count": 0}
    try:
        while True:
            raw = await asyncio.wait_for(ws.receive_text(), IDLE_SECONDS)
            try:
                message = json.loads(raw)
            except ValueError as err:
                await ws.send_text(json.dumps(_error("INVALID_JSON", f"Invalid JSON: {err}")))
                continue
            if isinstance(message, dict) and message.get("type") == "close":
                break
            try:
                answer, episode = await sessions.handle(message, episode, state)
            except Exception as err:  # the environment's own failure, reported, session kept
                answer = _error("EXECUTION_ERROR", f"{type(err).__name__}: {err}")
            await ws.send_text(json.dumps(answer, default=str))
    except (WebSocketDisconnect, TimeoutError):
        pass
    finally:
        sessions.open -= 1
        if episode is not None:
            await episode.close()
        await _quietly_close(ws)


async def _quietly_close(ws: WebSocket) -> None:
    try:
        await ws.close()
    except (RuntimeError, WebSocketDisconnect):  # already closed, or the client is gone
        pass


def build_app(name: str, adapter: Adapter, rules: Rules, key: str = "") -> Any:
    """The OpenEnv server of one published environment (module docstring)."""
    sessions = Sessions(name, adapter)

    def guarded(answer: Any) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            if not _keyed(request.headers, key):
                return JSONResponse({"detail": "a valid key is needed"}, 401)
            return JSONResponse(answer)

        return endpoint

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def ws(websocket: WebSocket) -> None:
        await _session(websocket, sessions, key)

    metadata = {"name": name, "description": f"Atropos environment {name}", "version": "1.0.0"}
    schema = {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}
    routes = [
        Route("/health", health),
        Route("/metadata", guarded(metadata)),
        Route("/schema", guarded(schema)),
        WebSocketRoute("/ws", ws),
    ]
    return server_app(routes, rules)


def publish(env_name: str, env_argv: list[str], host: str, port: int) -> None:
    """Serve `env_name` as an OpenEnv server on `host:port` until SIGINT or SIGTERM.

    Raises:
        ValueError: beyond loopback without a key; an environment that cannot be published.
        LookupError: an unknown environment.
    """
    import uvicorn

    from atropos.http.serve import uvicorn_config
    from atropos.interop.episodes import adapter
    from atropos.interop.publishing import KEY_VARIABLE, configured_env, take_api_key
    from atropos.names import is_loopback

    argv, key = take_api_key(env_argv)
    if not key and not is_loopback(host, resolve=True):
        raise ValueError(
            f"publishing on {host} (beyond loopback) needs a key: --api-key KEY or ${KEY_VARIABLE}"
        )
    env = configured_env(env_name, argv)
    found = adapter(env)
    rules = Rules(Site.of(host, api_key=bool(key)))
    app = build_app(env.name or env_name, found, rules, key or "")
    config = uvicorn_config(app, host=host, port=port, ws_max_size=MAX_FRAME)

    async def serve() -> None:  # set up and served on one event loop
        await found.setup()
        try:
            await uvicorn.Server(config).serve()
        finally:
            await found.close()

    asyncio.run(serve())
