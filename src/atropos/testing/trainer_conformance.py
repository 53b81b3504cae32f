"""A scripted trajectory API that checks a trainer integration against the trainer contract.

`ConformanceApi` plays the API's side (`docs/trainer-contract.md`): it answers `/register`,
serves scripted batches on `GET /batch` (after a few empty answers, so backing off is tested),
takes acks and policy versions, and records every call. Its report names each rule the trainer
broke and the call that broke it::

    with ConformanceApi(batches=3) as api:
        run_your_trainer(api.url)           # register, poll, train, publish, ack
    report = api.report()
    assert report.ok, report

Or in one line in a test: `assert_conforms(run_your_trainer, batches=3)`.

The rules (`RULES`) concern only what a trainer sends: the order of its calls, its
registration, its polling pace, its acks and the versions it publishes. It never sees the
trainer's loss; to check the advantages an integration computes, compare them with
`atropos.rewards.group.group_advantages` over the served groups (the contract's formula).

The app is built with `atropos.http.server_app` (the HTTP rules of every server we ship) and
served on 127.0.0.1 by `serve_in_thread`; a request the rules refuse (a form content type, a
foreign Host) is recorded and reported too.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from atropos import wire
from atropos.http import Rules, api_error, body, server_app
from atropos.testing.serve import serve_in_thread

__all__ = [
    "MIN_POLL_INTERVAL",
    "RULES",
    "Call",
    "ConformanceApi",
    "Report",
    "Violation",
    "assert_conforms",
    "check_trainer",
    "synthetic_group",
]

MIN_POLL_INTERVAL = 0.05
"""Seconds a trainer waits, on average, between an empty `GET /batch` answer and its next poll
(our client starts at 0.05 s and grows the wait 1.5x per empty answer, up to 1 s)."""

RULES: dict[str, str] = {
    "register_first": "POST /register comes before GET /batch, POST /batch/ack and"
    " POST /policy_version",
    "valid_body": "every body decodes as its `atropos.wire` struct and every query is in range",
    "batch_size": "batch_size (sequences per batch) holds at least the largest group, matches"
    " the scripted batches, and equals `expect_batch_size` when the test gives one",
    "max_token_len": "max_token_len is at least the longest scripted sequence (and"
    " `expect_max_token_len` when given)",
    "backoff": f"after an empty answer the next GET /batch waits: {MIN_POLL_INTERVAL} s or more"
    " on average (`min_poll_interval`)",
    "lease": "every GET /batch asks for a lease (`?lease=S`), when `require_lease`",
    "ack": "every leased batch is acknowledged with its batch_id, and only served ids are",
    "policy_version": "published versions never go down between two registrations, and lie"
    " between starting_step and starting_step + batches served",
    "publish": "a trainer that got a batch publishes a version (`POST /policy_version`), when"
    " `require_publish`",
    "known_route": "only the contract's routes are called",
    "http_rules": "requests pass the HTTP rules of every server (JSON content type, Host)",
}
"""Each rule's name and what it asks; a `Violation` names one."""

_READ_ONLY = ("/", "/health", "/info", "/status", "/wandb_info")
MAX_BODY = 16 * 2**20  # a trainer's bodies are small; a batch is never sent to the API


@dataclass
class Call:
    """One request the trainer made: when (seconds since the kit started), what, the answer."""

    index: int
    at: float
    method: str
    path: str
    query: str = ""
    status: int = 0
    body: Any = None
    answer: str = ""

    def __str__(self) -> str:
        query = f"?{self.query}" if self.query else ""
        what = f" ({self.answer})" if self.answer else ""
        shown = f" {self.body}" if self.body is not None else ""
        return (
            f"call #{self.index} at {self.at:.3f} s: {self.method} {self.path}{query}{shown}"
            f" -> {self.status}{what}"
        )


@dataclass
class Violation:
    """One broken rule, and the call that broke it (None: the run as a whole, e.g. no ack)."""

    rule: str
    message: str
    call: Call | None = None

    def __str__(self) -> str:
        where = f" [{self.call}]" if self.call is not None else ""
        return f"{self.rule}: {self.message}{where}"


@dataclass
class Report:
    """What the trainer did: every call, and every rule it broke."""

    violations: list[Violation]
    calls: list[Call]
    batches_served: int = 0
    versions: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def broken(self) -> set[str]:
        """The names of the rules broken."""
        return {v.rule for v in self.violations}

    def __str__(self) -> str:
        head = (
            f"{len(self.calls)} calls, {self.batches_served} batches served, versions"
            f" published {self.versions}"
        )
        if self.ok:
            return f"trainer conforms to contract {wire.CONTRACT_VERSION}: {head}"
        lines = [f"{len(self.violations)} violation(s) of contract {wire.CONTRACT_VERSION}:"]
        lines += [f"  - {v}" for v in self.violations]
        return "\n".join([*lines, f"  ({head})"])

    def assert_ok(self) -> None:
        """Raise AssertionError listing every violation, unless there is none."""
        if not self.ok:
            raise AssertionError(str(self))


def synthetic_group(
    size: int = 4, seed: int = 0, prompt_len: int = 3, completion_len: int = 4
) -> wire.Group:
    """A small group as an environment sends it: prompt + completion tokens, masks (-100 on the
    prompt), distinct scores, inference logprobs (1.0 where masked), messages, generation
    parameters, a policy version and a group id. `seed % 3` varies the optional parts:
    1 adds per-token `advantages`, 2 sets `overrides[0].set_advantage_to_zero`.

    >>> g = synthetic_group(2, seed=1)
    >>> g.masks[0], g.scores, g.advantages[1][-1]
    ([-100, -100, -100, 103, 104, 105, 106], [1.0, 0.0], -1.0)
    """
    n = prompt_len + completion_len
    tokens = [[seed * 100 + i for i in range(n)] for _ in range(size)]
    masks = [[-100] * prompt_len + row[prompt_len:] for row in tokens]
    scores = [1.0 - (i % 2) if size > 1 else 0.5 for i in range(size)]
    logprobs = [[1.0] * prompt_len + [-0.5] * completion_len for _ in range(size)]
    group = wire.Group(
        tokens=tokens,
        masks=masks,
        scores=scores,
        inference_logprobs=logprobs,
        messages=[[{"role": "user", "content": f"item {seed}"}] for _ in range(size)],
        generation_params={"temperature": 1.0},
        group_id=f"conformance-group-{seed}",
        policy_version=0,
        token_source="server",
    )
    if seed % 3 == 1:
        group.advantages = [[0.0] * prompt_len + [s * 2 - 1] * completion_len for s in scores]
    if seed % 3 == 2:
        group.overrides = [{"set_advantage_to_zero": i == 0} for i in range(size)]
    return group


def _batches_for(batch_size: int, group_size: int, count: int) -> list[list[wire.Group]]:
    """`count` batches of exactly `batch_size` sequences: groups of `group_size`, the last one
    smaller when `batch_size` is not a multiple (groups are never split)."""
    seeds = itertools.count()
    batches = []
    for _ in range(count):
        sizes = [group_size] * (batch_size // group_size)
        if batch_size % group_size:
            sizes.append(batch_size % group_size)
        batches.append([synthetic_group(s, next(seeds)) for s in sizes])
    return batches


def _answer(payload: bytes | dict[str, Any], status: int = 200) -> Response:
    content = payload if isinstance(payload, bytes) else wire.encode(payload)
    response = Response(content, status, media_type="application/json")
    response.headers[wire.CONTRACT_HEADER] = wire.CONTRACT_VERSION
    return response


def _refuse(status: int, message: str, kind: str = "ProtocolError") -> Response:
    return _answer(api_error(status, message, kind), status)


@dataclass
class _Served:
    """A batch handed out: its script index, lease id (None: plain GET) and the call."""

    index: int
    batch_id: str | None
    call: Call
    acked: bool = False


class ConformanceApi:
    """The scripted API (module docstring). Options:

    - `batches`: how many batches to serve (built at `/register` to the registered batch_size
      from `synthetic_group`s of `group_size`), or the batches themselves (lists of groups);
    - `empty_polls`: empty answers (`{"batch": null}`) before each batch;
    - `expect_batch_size`, `expect_max_token_len`: the values the integration should register;
    - `require_lease`, `require_publish`: make leasing and publishing versions rules;
    - `min_poll_interval`: the backoff threshold in seconds (`MIN_POLL_INTERVAL`).

    `url` is set inside the `with` block; `done` is set once every scripted batch was served
    (and acknowledged, when leased).
    """

    def __init__(
        self,
        batches: int | Sequence[Sequence[wire.Group]] = 3,
        group_size: int = 4,
        empty_polls: int = 2,
        expect_batch_size: int | None = None,
        expect_max_token_len: int | None = None,
        require_lease: bool = False,
        require_publish: bool = True,
        min_poll_interval: float = MIN_POLL_INTERVAL,
    ) -> None:
        self.auto = isinstance(batches, int)  # batches built at /register, to its batch_size
        self.script = None if isinstance(batches, int) else [list(b) for b in batches]
        self.count = batches if isinstance(batches, int) else len(self.script or [])
        self.group_size, self.empty_polls = group_size, empty_polls
        self.expect_batch_size, self.expect_max_token_len = expect_batch_size, expect_max_token_len
        self.require_lease, self.require_publish = require_lease, require_publish
        self.min_poll_interval = min_poll_interval
        self.url = ""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._calls: list[Call] = []
        self._violations: list[Violation] = []
        self._registration: wire.Registration | None = None
        self._served: list[_Served] = []
        self._replay: list[_Served] = []  # leased, unacknowledged, before a new /register
        self._empties_left = empty_polls
        self._last_empty: float | None = None
        self._gaps: list[tuple[float, Call]] = []
        self._versions: list[int] = []
        self._last_version: int | None = None  # since the last /register (a resume may go back)
        self._stack = contextlib.ExitStack()

    # ----- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ConformanceApi:
        self.url = self._stack.enter_context(serve_in_thread(_Recorder(self.app(), self)))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def app(self) -> Any:
        """The Starlette app (without the recorder in front: `__enter__` adds it)."""
        routes = [
            Route("/register", self._register, methods=["POST"]),
            Route("/batch", self._batch, methods=["GET"]),
            Route("/batch/ack", self._ack, methods=["POST"]),
            Route("/policy_version", self._policy_version, methods=["POST"]),
            *(Route(path, self._read_only, methods=["GET"]) for path in _READ_ONLY),
            Route("/{rest:path}", self._unknown, methods=["GET", "POST", "PUT", "DELETE"]),
        ]
        rules = Rules.loopback(open_paths=("/", "/health"), dialect=lambda path: api_error)
        return server_app(routes, rules)

    # ----- recording -----------------------------------------------------------------------

    def _begin(self, method: str, path: str, query: str) -> Call:
        with self._lock:
            call = Call(len(self._calls), time.monotonic() - self._t0, method, path, query)
            self._calls.append(call)
            return call

    def _break(self, rule: str, message: str, call: Call | None) -> None:
        self._violations.append(Violation(rule, message, call))

    def report(self) -> Report:
        """Every rule broken so far, with the checks that need the whole run (backoff, acks,
        publishing) made now."""
        with self._lock:
            found = list(self._violations) + self._end_of_run()
            return Report(found, list(self._calls), len(self._served), list(self._versions))

    def _end_of_run(self) -> list[Violation]:
        found = []
        if self._gaps:
            mean = sum(g for g, _ in self._gaps) / len(self._gaps)
            if mean < self.min_poll_interval:
                gap, call = min(self._gaps, key=lambda item: item[0])
                message = (
                    f"polled again {mean * 1e3:.1f} ms after an empty answer on average over"
                    f" {len(self._gaps)} polls (the rule: {self.min_poll_interval * 1e3:.0f} ms"
                    f" or more); the shortest wait, {gap * 1e3:.1f} ms, came before this call"
                )
                found.append(Violation("backoff", message, call))
        for served in self._served:
            if served.batch_id is not None and not served.acked:
                found.append(
                    Violation("ack", f"batch {served.batch_id} was never acknowledged", served.call)
                )
        if self.require_publish and self._served and not self._versions:
            found.append(
                Violation(
                    "publish",
                    f"{len(self._served)} batch(es) served but no POST /policy_version came",
                )
            )
        return found

    # ----- routes ----------------------------------------------------------------------------

    async def _decode(self, request: Request, kind: type[Any]) -> tuple[Call, Any]:
        call: Call = request.state.conformance_call
        try:
            raw = await body.read_body(request, MAX_BODY, MAX_BODY)  # gzip inflated, bounded
            value = wire.decode(raw, kind, body.is_msgpack(request))
        except wire.ProtocolError as err:
            with self._lock:
                self._break("valid_body", f"{kind.__name__}: {err}", call)
            return call, _refuse(err.status, str(err))
        call.body = msgspec.to_builtins(value)
        return call, value

    def _registered(self, call: Call) -> bool:
        if self._registration is None:
            self._break("register_first", f"{call.method} {call.path} before POST /register", call)
            return False
        return True

    async def _register(self, request: Request) -> Response:
        call, reg = await self._decode(request, wire.Registration)
        if isinstance(reg, Response):
            return reg
        with self._lock:
            again = self._registration is not None
            self._registration = reg
            if self.script is None:
                self.script = _batches_for(reg.batch_size, self.group_size, self.count)
            self._check_registration(reg, call)
            self._last_version = None
            if again:  # a restarted trainer gets its unacknowledged leases back first
                self._replay = [s for s in self._served if s.batch_id and not s.acked]
        return _answer({"uuid": 1})

    def _check_registration(self, reg: wire.Registration, call: Call) -> None:
        script = self.script or []
        largest = max((len(g.tokens) for b in script for g in b), default=1)
        if self.auto:
            largest = self.group_size
        sizes = {sum(len(g.tokens) for g in b) for b in script}
        longest = max((len(t) for b in script for g in b for t in g.tokens), default=1)
        size = reg.batch_size
        if size < largest:
            self._break(
                "batch_size",
                f"batch_size {size} is smaller than a group ({largest} sequences): batch_size"
                " counts sequences per batch, not generations per prompt",
                call,
            )
        elif sizes and sizes != {size}:
            self._break("batch_size", f"batch_size {size}, but the script's batches hold"
                        f" {sorted(sizes)} sequences", call)  # fmt: skip
        if self.expect_batch_size is not None and size != self.expect_batch_size:
            self._break(
                "batch_size",
                f"batch_size {size}, expected {self.expect_batch_size} (sequences per"
                " optimizer step: prompts per step x generations per prompt)",
                call,
            )
        expected = self.expect_max_token_len
        if reg.max_token_len < longest or (expected is not None and reg.max_token_len != expected):
            want = f"{expected}" if expected is not None else f"{longest} or more"
            self._break(
                "max_token_len", f"max_token_len {reg.max_token_len}, expected {want}", call
            )

    async def _batch(self, request: Request) -> Response:
        call: Call = request.state.conformance_call
        lease = _lease(request.query_params.get("lease"))
        with self._lock:
            if lease == "bad":
                self._break("valid_body", "lease: expected seconds in (0, 604800]", call)
                return _refuse(400, "lease: expected seconds in (0, 604800]")
            self._pace(call)
            if not self._registered(call):
                if lease is not None:
                    return _refuse(409, "no trainer is registered: call POST /register first")
                message = "Trainer not registered. Call /register first."
                return _answer({"status": "error", "message": message, "batch": []})
            if lease is None and self.require_lease:
                self._break("lease", "GET /batch without ?lease=: a crash loses the batch", call)
            served = self._next(call, lease is not None)
            if served is None:
                call.answer = "empty"
                self._last_empty = time.monotonic()
                return _answer(b'{"batch":null}')
            return self._serve(served, lease, call, body.wants_msgpack(request))

    def _pace(self, call: Call) -> None:
        """Measure the wait since the last empty answer."""
        now = time.monotonic()
        if self._last_empty is not None:
            self._gaps.append((now - self._last_empty, call))
        self._last_empty = None

    def _next(self, call: Call, leased: bool) -> _Served | None:
        if self._replay:
            again = self._replay.pop(0)
            again.acked = again.acked or not leased  # a plain GET consumes it, as the API's
            return again
        script = self.script or []
        if self._empties_left > 0 or len(self._served) >= len(script):
            self._empties_left -= 1
            return None
        self._empties_left = self.empty_polls
        index = len(self._served)
        served = _Served(index, f"conformance-{index + 1}" if leased else None, call)
        self._served.append(served)
        if len(self._served) == len(script) and not leased:
            self.done.set()
        return served

    def _serve(
        self, served: _Served, lease: float | str | None, call: Call, msgpack: bool
    ) -> Response:
        """The batch as the API sends it: upstream's keys, plus the lease's when leased; msgpack
        when the trainer's `Accept` asks for it."""
        assert self._registration is not None and self.script is not None
        doc: dict[str, Any] = {
            "batch": [msgspec.json.decode(wire.encode_group(g)) for g in self.script[served.index]]
        }
        if served.batch_id is not None:
            doc["batch_id"] = served.batch_id
            doc["lease_expires"] = time.time() + float(lease or 0)
            doc["step"] = self._registration.starting_step + served.index + 1
        call.answer = f"batch {served.index + 1}" + (
            f", batch_id {served.batch_id}" if served.batch_id else ""
        )
        if msgpack:
            response = Response(msgspec.msgpack.encode(doc), media_type="application/msgpack")
            response.headers[wire.CONTRACT_HEADER] = wire.CONTRACT_VERSION
            return response
        return _answer(doc)

    async def _ack(self, request: Request) -> Response:
        call, ack = await self._decode(request, wire.BatchAck)
        if isinstance(ack, Response):
            return ack
        with self._lock:
            if not self._registered(call):
                return _refuse(409, "no trainer is registered: call POST /register first")
            found = [s for s in self._served if s.batch_id == ack.batch_id]
            if not found:
                self._break("ack", f"acknowledged {ack.batch_id!r}, which was never served", call)
                return _refuse(404, f"batch_id: no leased batch {ack.batch_id!r}", "NotFound")
            before = found[0].acked
            found[0].acked = True
            leased = [s for s in self._served if s.batch_id]
            if len(self._served) == len(self.script or []) and all(s.acked for s in leased):
                self.done.set()
        return _answer({"status": "already acknowledged" if before else "acknowledged"})

    async def _policy_version(self, request: Request) -> Response:
        call, said = await self._decode(request, wire.PolicyPublished)
        if isinstance(said, Response):
            return said
        with self._lock:
            if self._registered(call):
                self._check_version(said.version, call)
            self._versions.append(said.version)
            self._last_version = said.version
        return _answer({"status": "ok", "policy_version": said.version})

    def _check_version(self, version: int, call: Call) -> None:
        assert self._registration is not None
        low = self._registration.starting_step
        high = low + len(self._served)
        last = self._last_version
        if last is not None and version < last:
            self._break(
                "policy_version",
                f"version {version} after {last}: versions never go down (but after a new"
                " POST /register, a resumed trainer's)",
                call,
            )
        elif not low <= version <= high:
            self._break(
                "policy_version",
                f"version {version} outside {low}..{high} (starting_step {low}, then one per"
                f" batch trained; {len(self._served)} served so far)",
                call,
            )

    async def _read_only(self, request: Request) -> Response:
        reg = self._registration
        path = request.url.path
        if path == "/":
            return _answer({"message": "AtroposLib API"})
        if path == "/health":
            return _answer({"status": "ok"})
        if path == "/info":
            if reg is None:
                return _answer({"batch_size": -1, "max_token_len": -1})
            return _answer({"batch_size": reg.batch_size, "max_token_len": reg.max_token_len})
        if path == "/wandb_info":
            return _answer({"group": reg and reg.wandb_group, "project": reg and reg.wandb_project})
        step = (reg.starting_step if reg else 0) + len(self._served)
        return _answer({"current_step": step, "queue_size": 0})

    async def _unknown(self, request: Request) -> Response:
        call: Call = request.state.conformance_call
        with self._lock:
            self._break("known_route", f"{call.method} {call.path} is not a route of the API", call)
        return _refuse(404, f"no route {call.path}", "NotFound")


def _lease(raw: str | None) -> float | str | None:
    """The `?lease=` seconds, None when absent, "bad" when not in (0, 604800]."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return "bad"
    return value if 0 < value <= 7 * 24 * 3600 else "bad"


class _Recorder:
    """ASGI in front of the HTTP rules: records every request (also those the rules refuse)
    and its status; a refusal by the rules is a violation of `http_rules`."""

    def __init__(self, app: Any, kit: ConformanceApi) -> None:
        self.app, self.kit = app, kit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"").decode("latin-1")
        call = self.kit._begin(scope["method"], scope["path"], query)
        scope.setdefault("state", {})["conformance_call"] = call

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                call.status = message["status"]
                if call.status in (403, 413, 415, 431) and not call.answer:
                    with self.kit._lock:
                        self.kit._break("http_rules", f"refused with {call.status}", call)
            await send(message)

        await self.app(scope, receive, recording_send)


def check_trainer(run: Callable[[str], object], **options: Any) -> Report:
    """Run `run(url)` (the integration under test, pointed at the kit) and return the report;
    `options` are `ConformanceApi`'s."""
    with ConformanceApi(**options) as api:
        run(api.url)
        return api.report()


def assert_conforms(run: Callable[[str], object], **options: Any) -> Report:
    """`check_trainer`, failing the test (AssertionError listing every violation) unless the
    trainer broke no rule; returns the report for further checks."""
    report = check_trainer(run, **options)
    report.assert_ok()
    return report
