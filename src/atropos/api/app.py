"""The trajectory API as a Starlette app: thin routes over `Hub`.

Every route of atroposlib 0.4.0 is here with its request and response shapes; the extensions
(`/batch?lease=`, `/batch/ack`, `/policy_version`, `/health`, `/stats`, `/metrics`,
`/openapi.json`, msgspec bodies, the `Atropos-Contract` header naming the trainer contract's
version on every answer of a route) are invisible to old clients. Errors are 4xx JSON
`{"error": {"type", "message"}, "detail"}`; `detail` is what FastAPI clients read.

The app is built with the HTTP rules of every server we ship (`atropos.http`: Host, Origin and
Fetch-Metadata, content types, body limit), in front of everything. Every route then runs inside
`Api.guard`: the API key, strict query integers, and a last line of defence: an exception a
handler did not expect is answered (4xx when the input provoked it, else 500), logged once with
its traceback and counted in `/stats` (`internal_errors`), and the connection and the server
carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from atropos import wire
from atropos.api import dashboard, ingest, stats
from atropos.api.hub import EnvLatency, Hub, HubConfig
from atropos.api.openapi import openapi_document
from atropos.api.store import Store, open_store
from atropos.http import Rules, Site, api_error, body, decode, server_app
from atropos.http.body import GzipPolicy
from atropos.wire import (
    EnvIdentifier,
    EnvStatusRequest,
    ProtocolError,
    RegisterEnv,
    Registration,
)

Handler = Callable[[Request], Awaitable[Response]]
OPEN_PATHS = ("/", "/health", "/dashboard")
"""Pages that answer without the API key and to other sites' links (they hold no data)."""
log = logging.getLogger("atropos.api")
# Exceptions that only input can provoke where they escape a handler (too deep, too large or
# undecodable values that a check missed): answered 400, but still logged and counted.
INPUT_FAULTS = (RecursionError, UnicodeError, OverflowError)

_EMPTY_EXAMPLE = wire.encode(
    {
        "tokens": [],
        "masks": [],
        "scores": [],
        "advantages": [],
        "ref_logprobs": [],
        "generation_params": [],
        "inference_logprobs": [],
        "messages": [],
        "images": [],
    }
)
_NOT_REGISTERED = wire.encode(
    {"status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}
)


@dataclass
class ApiConfig:
    """Settings of one API process."""

    store: str = "memory"
    api_key: str | None = None
    host: str = "127.0.0.1"  # the bound address: decides which Host names are served
    allowed_hosts: list[str] = field(default_factory=list)  # `--allowed-host` names ('*': any)
    env_timeout: float = 120.0
    max_staleness: int | None = None
    max_body_bytes: int = 256 * 2**20
    max_inflated_bytes: int = 256 * 2**20  # as max_body_bytes: gzip carries no more than plain
    cors_origins: list[str] = field(default_factory=list)
    response_gzip: GzipPolicy = "auto"
    history_interval: float = 2.0  # seconds between `/stats/history` samples


async def _error(request: Request, status: int, message: str, kind: str) -> Response:
    payload = wire.encode(api_error(status, message, kind))
    return await body.respond(request, payload, status)


class Api:
    """Routes bound to one hub."""

    def __init__(self, hub: Hub, config: ApiConfig) -> None:
        self.hub = hub
        self.config = config
        self.history = stats.History(config.history_interval)
        self.site = Site.of(
            config.host, config.allowed_hosts, config.api_key is not None, config.cors_origins
        )

    def guard(self, fn: Handler) -> Handler:
        """Wrap a route: API key check, `?env_id=` heartbeat,
        protocol errors -> 4xx, anything unexpected -> logged, counted, answered; every answer
        carries the trainer contract's version (`Atropos-Contract: 1.0`, `wire.CONTRACT_VERSION`).
        """
        key = self.config.api_key

        async def route(request: Request) -> Response:
            response = await answer(request)
            response.headers[wire.CONTRACT_HEADER] = wire.CONTRACT_VERSION
            return response

        async def answer(request: Request) -> Response:
            if key is not None and request.url.path not in OPEN_PATHS:
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                    return await _error(
                        request, 401, "missing or wrong 'Authorization: Bearer KEY'", "AuthError"
                    )
            try:
                env_id = _int_param(request, "env_id", -1, 0, wire.ENV_ID_MAX)
                if env_id >= 0:
                    self.hub.heartbeat(env_id)
                return await fn(request)
            except ProtocolError as err:
                return await _error(request, err.status, str(err), type(err).__name__)
            except ClientDisconnect:
                return Response(status_code=400)  # nobody is listening for an answer
            except Exception as err:
                return await self._unexpected(request, err)

        return route

    async def _unexpected(self, request: Request, err: Exception) -> Response:
        """An exception no check foresaw: one log record with its traceback, one count, and an
        answer on the same connection (400 when only input can cause it, else 500)."""
        self.hub.internal_errors += 1
        number = self.hub.internal_errors
        log.error(
            "internal error #%d on %s %s: %s",
            number,
            request.method,
            request.url.path,
            type(err).__name__,
            exc_info=err,
        )
        if isinstance(err, INPUT_FAULTS):
            message = f"the request could not be processed ({type(err).__name__}): check its values"
            return await _error(request, 400, message, "BadRequest")
        message = f"internal error #{number} ({type(err).__name__}); the API's log has the details"
        return await _error(request, 500, message, "InternalError")

    async def _body(self, request: Request) -> bytes:
        """The body, within the limits; a JSON body must be UTF-8 throughout (the typed
        decoders skip the keys they do not know without looking at them)."""
        raw = await body.read_body(
            request, self.config.max_body_bytes, self.config.max_inflated_bytes
        )
        if not body.is_msgpack(request):
            decode.check_utf8(raw)
        return raw

    async def _json(self, request: Request, obj: object, status: int = 200) -> Response:
        return await body.respond(request, wire.encode(obj), status)

    # ----- routes ----------------------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        return await self._json(request, {"message": "AtroposLib API"})

    async def health(self, request: Request) -> Response:
        return await self._json(request, {"status": "ok"})

    async def register(self, request: Request) -> Response:
        reg = wire.decode(await self._body(request), Registration, body.is_msgpack(request))
        return await self._json(request, self.hub.register(reg))

    async def register_env(self, request: Request) -> Response:
        req = wire.decode(await self._body(request), RegisterEnv, body.is_msgpack(request))
        return await self._json(request, self.hub.register_env(req))

    async def disconnect_env(self, request: Request) -> Response:
        ident = wire.decode(await self._body(request), EnvIdentifier, body.is_msgpack(request))
        return await self._json(request, self.hub.disconnect_env(ident.env_id))

    async def wandb_info(self, request: Request) -> Response:
        return await self._json(request, self.hub.wandb_info())

    async def info(self, request: Request) -> Response:
        return await self._json(request, self.hub.info())

    async def batch(self, request: Request) -> Response:
        lease = _lease_seconds(request)
        if self.hub.registration is None:
            if lease is not None:
                raise ProtocolError("no trainer is registered: call POST /register first", 409)
            return await body.respond(request, _NOT_REGISTERED)
        served = self.hub.next_batch(lease)
        if served is None:
            return await body.respond(request, b'{"batch":null}')
        if body.wants_msgpack(request):
            doc: dict[str, object] = {
                "batch": [msgspec.json.decode(b) for b in served.bodies],
                "step": served.step,
            }
            if served.batch_id is not None:
                doc.update(batch_id=served.batch_id, lease_expires=served.lease_expires)
            return await body.respond(
                request, msgspec.msgpack.encode(doc), 200, "application/msgpack"
            )
        tail = b""
        if served.batch_id is not None:
            tail = b',"batch_id":"%s","lease_expires":%r,"step":%d' % (
                served.batch_id.encode(),
                served.lease_expires,
                served.step,
            )
        payload = b"".join((b'{"batch":[', b",".join(served.bodies), b"]", tail, b"}"))
        return await body.respond(request, payload)

    async def batch_ack(self, request: Request) -> Response:
        ack = wire.decode(await self._body(request), wire.BatchAck, body.is_msgpack(request))
        return await self._json(request, self.hub.ack(ack.batch_id))

    async def policy_version(self, request: Request) -> Response:
        said = wire.decode(
            await self._body(request), wire.PolicyPublished, body.is_msgpack(request)
        )
        return await self._json(request, self.hub.publish(said.version))

    async def eval_results(self, request: Request) -> Response:
        said = wire.decode(await self._body(request), wire.EvalResult, body.is_msgpack(request))
        return await self._json(request, self.hub.report_eval(said))

    async def latest_example(self, request: Request) -> Response:
        return await body.respond(request, self.hub.latest or _EMPTY_EXAMPLE)

    async def scored_data(self, request: Request) -> Response:
        raw = await self._body(request)
        group, stored = ingest.decode_group(raw, body.is_msgpack(request))
        [outcome] = self.hub.ingest([group], [stored])
        doc: dict[str, object] = {"status": "received"}
        if outcome == "duplicate":
            doc["duplicate"] = True
        return await self._json(request, doc)

    async def scored_data_list(self, request: Request) -> Response:
        raw = await self._body(request)
        decoded = ingest.decode_group_list(raw, body.is_msgpack(request))
        groups = [g for g, _ in decoded]
        outcomes = self.hub.ingest(groups, [stored for _, stored in decoded])
        doc: dict[str, object] = {"status": "received", "groups_processed": len(groups)}
        duplicates = outcomes.count("duplicate")
        if duplicates:
            doc["duplicates"] = duplicates
        return await self._json(request, doc)

    async def status(self, request: Request) -> Response:
        return await self._json(request, self.hub.status())

    async def status_env(self, request: Request) -> Response:
        """The env's id from the body (`{"env_id", "dropped"?, "failed"?}`) or `?env_id=`;
        a body's `dropped` and `failed` counts are kept as the env's latest report."""
        query = _int_param(request, "env_id", -1, 0, wire.ENV_ID_MAX)
        raw = await self._body(request)
        report: EnvStatusRequest | None = None
        if raw:
            try:
                report = wire.decode(raw, EnvStatusRequest, body.is_msgpack(request))
            except ProtocolError as err:
                raise ProtocolError(_report_hint(str(err)), err.status) from None
            env_id = report.env_id
        if query >= 0:
            if report is not None and report.env_id != query:
                raise ProtocolError(
                    f"env_id: the query says {query} but the body says {report.env_id};"
                    " give one, or the same in both"
                )
            env_id = query
        elif report is None:
            raise ProtocolError("env_id: give it as ?env_id= or a JSON body {'env_id': N}")
        answer = self.hub.status_env(env_id)
        if report is not None:
            self.hub.report(env_id, report.dropped, report.failed, report.outcomes)
            if report.servers is not None:
                self.hub.report_servers(env_id, report.servers)
            if report.latency is not None or report.paced_seconds is not None:
                self.hub.report_latency(
                    env_id, EnvLatency(report.latency or {}, report.paced_seconds)
                )
        return await self._json(request, answer)

    async def reset_data(self, request: Request) -> Response:
        self.hub.reset()
        return PlainTextResponse("Reset successful")

    async def stats(self, request: Request) -> Response:
        return await self._json(request, stats.stats(self.hub))

    async def stats_history(self, request: Request) -> Response:
        if not self.history.samples:  # before the sampler's first tick
            self.history.sample(self.hub)
        return await self._json(request, self.history.document())

    async def rollouts(self, request: Request) -> Response:
        """Recently accepted groups for read-only readers: `?after=SEQ` (default: from the
        oldest remembered) and `?limit=N` (1..1000, default 100). Consumes nothing."""
        after = _int_param(request, "after", -1, -1, 2**62)
        limit = _int_param(request, "limit", 100, 1, 1000)
        found, missed = self.hub.rollouts(after, limit)
        items = [
            b'{"seq":%d,"env_id":%s,"received":%r,"group":%s}'
            % (r.seq, b"null" if r.env_id is None else b"%d" % r.env_id, r.received, r.body)
            for r in found
        ]
        held = self.hub.recent
        oldest = held[0].seq if held else None
        newest = held[-1].seq if held else None
        tail = wire.encode(
            {
                "next": found[-1].seq if found else max(after, -1),
                "oldest": oldest,
                "newest": newest,
                "missed": missed,
            }
        )
        payload = b'{"rollouts":[' + b",".join(items) + b"]," + tail[1:]
        return await body.respond(request, payload)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(stats.prometheus(self.hub), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        return await self._json(request, openapi_document())

    def routes(self) -> list[Route]:
        table: list[tuple[str, Handler, list[str]]] = [
            ("/", self.root, ["GET"]),
            ("/health", self.health, ["GET"]),
            ("/register", self.register, ["POST"]),
            ("/register-env", self.register_env, ["POST"]),
            ("/disconnect-env", self.disconnect_env, ["POST"]),
            ("/wandb_info", self.wandb_info, ["GET"]),
            ("/info", self.info, ["GET"]),
            ("/batch", self.batch, ["GET"]),
            ("/batch/ack", self.batch_ack, ["POST"]),
            ("/policy_version", self.policy_version, ["POST"]),
            ("/eval_results", self.eval_results, ["POST"]),
            ("/latest_example", self.latest_example, ["GET"]),
            ("/scored_data", self.scored_data, ["POST"]),
            ("/scored_data_list", self.scored_data_list, ["POST"]),
            ("/status", self.status, ["GET"]),
            ("/status-env", self.status_env, ["GET", "POST"]),
            ("/reset_data", self.reset_data, ["GET", "POST"]),
            ("/stats", self.stats, ["GET"]),
            ("/stats/history", self.stats_history, ["GET"]),
            ("/rollouts", self.rollouts, ["GET"]),
            ("/metrics", self.metrics, ["GET"]),
            ("/openapi.json", self.openapi, ["GET"]),
            ("/dashboard", dashboard.serve, ["GET"]),
        ]
        return [Route(path, self.guard(fn), methods=methods) for path, fn, methods in table]


def _report_hint(message: str) -> str:
    """A `/status-env` decoding error, with the rule for `dropped` and `failed` when it is
    about them."""
    if "$.dropped" not in message and "$.failed" not in message:
        return message
    return (
        f"{message}; `dropped` and `failed` map at most {wire.REPORT_MAX_NAMES} names of 1 to"
        f" {wire.REPORT_MAX_NAME_LENGTH} characters to counts from 0 to {wire.REPORT_MAX_COUNT}"
    )


_QUERY_INT = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only: int() also takes "²", "1_0"


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The query parameter `name` as an integer in low..high (`default` when absent); a 400
    naming the parameter for anything else (a sign where none fits, other digits, 5000 digits).
    """
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = int(raw) if _QUERY_INT.fullmatch(raw) else None
    if value is None or not low <= value <= high:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ProtocolError(f"{name}: expected an integer from {low} to {high}, got {shown!r}", 400)
    return value


async def _sample(api: Api) -> None:
    """Sample `/stats/history` until cancelled (a failed sample is skipped, never fatal)."""
    while True:
        with contextlib.suppress(Exception):
            api.history.sample(api.hub)
        await asyncio.sleep(api.history.interval)


def _lease_seconds(request: Request) -> float | None:
    raw = request.query_params.get("lease")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > 7 * 24 * 3600:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ProtocolError(f"lease: expected seconds in (0, 604800], got {shown!r}", 400)
    return value


def create_app(config: ApiConfig | None = None, store: Store | None = None) -> Starlette:
    """Build the API app. The store is opened from `config.store` unless one is given."""
    config = config or ApiConfig()
    store = store if store is not None else open_store(config.store)
    hub = Hub(store, HubConfig(config.env_timeout, config.max_staleness))
    api = Api(hub, config)
    middleware = []
    if config.cors_origins:
        # Listed origins only, and never with credentials (upstream allowed '*' + credentials).
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=config.cors_origins,
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "content-encoding"],
                allow_credentials=False,
            )
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(_sample(api))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            store.close()

    rules = Rules(api.site, OPEN_PATHS, config.max_body_bytes, lambda path: api_error)
    app = server_app(api.routes(), rules, middleware=middleware, lifespan=lifespan)
    app.state.hub = hub
    app.state.response_gzip = config.response_gzip
    return app
