"""ORS out: `atropos env publish NAME --as ors` serves one of our environments as an ORS server
that openreward's client (and TRL's adapter on it) can train on.

The routes are the official server's (`wire` lists them), for the one environment, named as
ours is (`gsm8k`); the session routes are also answered without the `/{env}` prefix. What an
environment offers as tasks and tools is its adapter's (`atropos.interop.episodes`, shared
with OpenEnv). The server is built
with `atropos.http.server_app` and `Rules`: Host and Origin checks, body limits, and a key
beyond loopback: bound to another address, it starts only with a key (`--api-key KEY`, else
`$ATROPOS_API_KEY`), and then every route but `/health` needs it (`X-API-Key`, as openreward
sends it, or `Authorization: Bearer`). Sessions are deleted by `/delete`, or after `idle_s`
seconds without a request; at most `max_sessions` are open at once (then `/create` answers 503).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from atropos.http import Rules, Site, server_app
from atropos.interop.episodes import Adapter, Episode
from atropos.interop.ors.wire import dumps, sse_event, sse_result, text_blocks
from atropos.interop.publishing import KEY_VARIABLE
from atropos.names import is_loopback

log = logging.getLogger("atropos.interop.ors")

__all__ = ["ORSApp", "build_app", "publish"]
_SSE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ORSProblem(Exception):
    """A request we refuse: its status and detail (the official server's `{"detail"}`)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class Session:
    """One client session: its episode once `/create` made it, and when it was last used."""

    episode: Episode | None = None
    used: float = field(default_factory=time.monotonic)


class ORSApp:
    """The routes' state: the environment's adapter, its sessions and the key."""

    def __init__(
        self,
        name: str,
        adapter: Adapter,
        api_key: str | None,
        max_sessions: int = 1024,
        idle_s: float = 900.0,
    ) -> None:
        self.name = name
        self.adapter = adapter
        self.api_key = api_key
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.sessions: dict[str, Session] = {}

    # ----- access and lookups -------------------------------------------------------------------

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("x-api-key") or ""
        bearer = request.headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:]
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ORSProblem(401, "missing or wrong key (X-API-Key or Authorization: Bearer)")

    def check_env(self, request: Request) -> None:
        env = request.path_params.get("env")
        if env is not None and env.lower() != self.name.lower():
            raise ORSProblem(404, f"unknown environment {env!r} (this server has {self.name!r})")

    def items(self, split: Any) -> Sequence[Any]:
        if split not in self.adapter.splits:
            raise ORSProblem(400, f"Invalid split {split!r}: the splits are {self.split_names()}")
        return self.adapter.splits[split]

    def split_names(self) -> list[str]:
        return sorted(self.adapter.splits)

    def session(self, request: Request, created: bool = True) -> Session:
        sid = request.headers.get("x-session-id", "").strip()
        if not sid:
            raise ORSProblem(400, "X-Session-ID header is required")
        found = self.sessions.get(sid)
        if found is None or (created and found.episode is None):
            raise ORSProblem(404, "Active environment not found")
        found.used = time.monotonic()
        return found

    async def reap(self) -> None:
        """Delete the sessions idle for `idle_s` seconds."""
        now = time.monotonic()
        stale = [sid for sid, s in self.sessions.items() if now - s.used > self.idle_s]
        for sid in stale:
            await self.drop(sid)

    async def drop(self, sid: str) -> None:
        found = self.sessions.pop(sid, None)
        if found is not None and found.episode is not None:
            await found.episode.close()


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise ORSProblem(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ORSProblem(400, "the body must be a JSON object")
    return body


def _task(app: ORSApp, body: dict[str, Any]) -> tuple[str, int]:
    """The (split, index) a body names: `split` and `index`, or a `task_spec` holding them."""
    spec = body.get("task_spec") or body
    split, index = spec.get("split"), spec.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ORSProblem(400, "give split and index (or a task_spec {split, index})")
    items = app.items(split)
    if not 0 <= index < len(items):
        raise ORSProblem(400, f"Invalid index {index}: split {split!r} has {len(items)} tasks")
    return str(split), index


# ----- the routes -----------------------------------------------------------------------------


async def health(app: ORSApp, request: Request) -> Any:
    return {"status": "ok"}


async def environments(app: ORSApp, request: Request) -> Any:
    return [app.name]


async def splits(app: ORSApp, request: Request) -> Any:
    return [
        {"name": n, "type": n if n in ("train", "test") else "validation"}
        for n in app.split_names()
    ]


async def tools(app: ORSApp, request: Request) -> Any:
    return {"tools": app.adapter.tools, "terminal_tool": None, "supports_score_group": False}


async def num_tasks(app: ORSApp, request: Request) -> Any:
    return {"num_tasks": len(app.items((await _body(request)).get("split")))}


async def tasks(app: ORSApp, request: Request) -> Any:
    body = await _body(request)
    split = body.get("split")
    count = len(app.items(split))
    start, stop, _ = slice(body.get("start"), body.get("stop")).indices(count)
    if request.url.path.endswith("/task"):
        split, index = _task(app, body)
        return {"task": {"split": split, "index": index}, "env_name": app.name}
    listed = [{"split": split, "index": i} for i in range(start, stop)]
    return {"tasks": listed, "env_name": app.name}


async def ping(app: ORSApp, request: Request) -> Any:
    app.session(request, created=False)
    return {"status": "ok"}


async def create_session(app: ORSApp, request: Request) -> Any:
    await app.reap()
    if len(app.sessions) >= app.max_sessions:
        raise ORSProblem(503, f"{app.max_sessions} sessions are open: close one or retry later")
    sid = str(uuid.uuid4())
    app.sessions[sid] = Session()
    events = [sse_event("task_id", sid), sse_event("end", "")]
    return _stream(events)


async def create(app: ORSApp, request: Request) -> Any:
    session = app.session(request, created=False)
    if session.episode is not None:
        raise ORSProblem(400, "Session already exists")
    split, index = _task(app, await _body(request))
    session.episode = await app.adapter.start(app.adapter.splits[split][index])
    return {"sid": request.headers["x-session-id"].strip()}


async def delete(app: ORSApp, request: Request) -> Any:
    sid = request.headers.get("x-session-id", "").strip()
    await app.drop(sid)
    return {"sid": sid}


async def prompt(app: ORSApp, request: Request) -> Any:
    episode = app.session(request).episode
    assert episode is not None
    text = "\n\n".join(str(m["content"]) for m in episode.messages)
    return text_blocks(text)


async def messages(app: ORSApp, request: Request) -> Any:
    episode = app.session(request).episode
    assert episode is not None
    return [
        {"role": m["role"], "blocks": text_blocks(str(m["content"])), "detail": None}
        for m in episode.messages
        if m["role"] in ("system", "user", "assistant")
    ]


async def call(app: ORSApp, request: Request) -> Any:
    episode = app.session(request).episode
    assert episode is not None
    body = await _body(request)
    name, arguments = body.get("name"), body.get("input") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ORSProblem(400, 'the body is {"name": TOOL, "input": {...}}')
    task_id = uuid.uuid4().hex
    try:
        step = await episode.call(name, arguments)
        output = {"blocks": text_blocks(step.text), "metadata": None}
        result = {
            "ok": True,
            "output": {**output, "reward": step.reward, "finished": step.finished},
        }
    except ValueError as e:
        reason = "not_found" if "not a valid tool" in str(e) else "input_validation"
        result = {"ok": False, "error": str(e), "reason": reason}
    except Exception as e:  # the tool itself failed (e.g. its MCP server): ORS's `error` event
        log.warning("ORS tool %s failed: %s: %s", name, type(e).__name__, e)
        error = sse_event("error", f"{type(e).__name__}: {e}")
        return _stream([sse_event("task_id", task_id), error])
    return _stream(list(sse_result(task_id, dumps(result))))


def _stream(events: list[bytes]) -> Response:
    """The SSE answer, whole: its events are all known at once, so one body with its length
    (one write, and the client's connection is kept for the next request)."""
    return Response(b"".join(events), media_type="text/event-stream", headers=_SSE)


ROUTES: list[tuple[str, str, Any, bool]] = [  # path, method, handler, also under /{env}
    ("/health", "GET", health, False),
    ("/list_environments", "GET", environments, False),
    ("/splits", "GET", splits, True),
    ("/tools", "GET", tools, True),
    ("/num_tasks", "POST", num_tasks, True),
    ("/tasks", "POST", tasks, True),
    ("/task", "POST", tasks, True),
    ("/task_range", "POST", tasks, True),
    ("/ping", "POST", ping, False),
    ("/create_session", "POST", create_session, False),
    ("/create", "POST", create, False),
    ("/delete", "POST", delete, False),
    ("/delete_session", "POST", delete, False),
    ("/prompt", "GET", prompt, True),
    ("/messages", "GET", messages, True),
    ("/task_tools", "GET", tools, True),
    ("/call", "POST", call, True),
]


def _endpoint(app: ORSApp, handler: Any, public: bool) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            if not public:
                app.check_key(request)
            app.check_env(request)
            answer = await handler(app, request)
        except ORSProblem as e:
            return JSONResponse({"detail": e.detail}, status_code=e.status)
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    return endpoint


def build_app(state: ORSApp, host: str = "127.0.0.1") -> Any:
    """The Starlette app serving `state` behind our HTTP rules for a server bound to `host`."""
    routes = []
    for path, method, handler, prefixed in ROUTES:
        endpoint = _endpoint(state, handler, path == "/health")
        routes.append(Route(path, endpoint, methods=[method]))
        if prefixed:
            routes.append(Route("/{env}" + path, endpoint, methods=[method]))
    site = Site.of(host, (), state.api_key is not None)
    rules = Rules(site, ("/health",))
    shim = EmptyBodyType(server_app(routes, rules))
    shim.http_rules = rules  # type: ignore[attr-defined]
    return shim


class EmptyBodyType:
    """openreward's client (aiohttp) sends its bodiless POSTs (`/ping`, `/delete`) with
    `Content-Type: application/octet-stream`, a type our rules refuse; for a request with no
    body that header is dropped before the rules see it. Safe: no page can send it cross-site
    without a preflight (it is not a type a form or a simple `fetch` sends), and there is no
    body for it to describe."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "POST":
            headers = scope.get("headers") or []
            named = {k.lower(): v for k, v in headers}
            empty = named.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in named
            if empty and named.get(b"content-type") == b"application/octet-stream":
                kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
                scope = {**scope, "headers": kept}
        await self.app(scope, receive, send)


def publish(env_name: str, env_argv: list[str], host: str, port: int) -> None:
    """`atropos env publish NAME --as ors`: serve until SIGINT or SIGTERM.

    Raises:
        ValueError: beyond loopback without `$ATROPOS_API_KEY`; an environment that cannot be
            published (named).
        LookupError: an unknown environment.
    """
    import uvicorn

    from atropos.http.serve import uvicorn_config
    from atropos.interop.episodes import adapter
    from atropos.interop.publishing import configured_env, take_api_key

    env_argv, key = take_api_key(env_argv)
    if key is None and not is_loopback(host, resolve=True):
        raise ValueError(
            f"bound to {host}, beyond loopback, the server needs a key: --api-key KEY or"
            f" ${KEY_VARIABLE} (clients send it as X-API-Key)"
        )
    env = configured_env(env_name, env_argv)
    found = adapter(env)
    name = str(getattr(env, "name", env_name))
    app = build_app(ORSApp(name, found, key), host)

    async def serve() -> None:  # set up and served on one event loop
        await found.setup()
        print(f"ORS environment {name!r}: ors:http://{host}:{port}#{name}", flush=True)
        try:
            await uvicorn.Server(uvicorn_config(app, host=host, port=port)).serve()
        finally:
            await found.close()

    asyncio.run(serve())
