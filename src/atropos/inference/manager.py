"""`ServerManager`: one front for many inference servers, as environments see it.

It exposes the backend calls (`chat_completion`, `completion`, `tokens_and_logprobs_completion`,
`get_logprobs`), each with `split="train" | "eval"` (separate budgets per server; atroposlib 0.4.0
dropped `split`, so eval calls used the training budget), and adds what a single backend does not
do: least-loaded routing among healthy servers, session-affine routing of conversations
(`routing`: a session's turns stay on the server that holds its prefix, with the engines'
session hints), waiting for capacity without polling, token-free health probes, failover and
bounded jittered retries for retryable errors only, one deadline per call, `n` split into chunks
of `max_n_completions`, an adaptive share of capacity (`update_weight`), adaptive per-server
concurrency (`concurrency`, when on), token-exact sessions (`managed_server`) and bounded
per-server metrics for logging (`metrics`). Token calls go only to servers that can answer them,
so a list may mix server types.

>>> from atropos.inference.config import APIServerConfig
>>> ServerManager([APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="vllm")])
<ServerManager 1 server, 1 healthy, weight 1: [<server 0 vllm http://127.0.0.1:9/v1 healthy \
train 0/512 eval 0/64>]>
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atropos.inference.base import (
    CURRENT_CALL,
    Call,
    InferenceServer,
    PromptLogprobs,
    Split,
    TokensAndLogprobs,
    create_backend,
    gather_or_cancel,
    within,
)
from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig
from atropos.inference.errors import InferenceError, InferenceTimeout, UnsupportedOperation
from atropos.inference.openai import merge_completions
from atropos.inference.pool import SPLITS, ServerPool, ServerSlot
from atropos.inference.reasoning import ChatPlan, Reasoning, TemplatePlan, WarnOnce
from atropos.inference.retry import RetryPolicy
from atropos.inference.routing import SessionHomes, header_lines, new_session_key
from atropos.inference.server_metrics import ServerMetrics
from atropos.inference.slurm import resolve_server_configs

if TYPE_CHECKING:  # imported where first used below, as in `managed_server`
    from atropos.inference.managed import ChatTurn, ManagedServer

NEEDS = {
    "tokens_and_logprobs_completion": "supports_tokens",
    "get_logprobs": "supports_prompt_logprobs",
}
"""Calls only some backends can answer, and the backend flag that says so."""
DEFAULT_SERVER_WAIT = 60.0
"""Seconds every server may be unreachable in a row before calls fail (and the run stops), when
`server_wait` is not set."""


class PinnedServer:
    """The four backend calls through the manager, preferring (or holding) one server.

    `managed_server()` gives one to `ManagedServer`: a session (`session`, its key), whose calls
    stay on its home server while that is healthy, has room and is within the load ratio (good
    for its prefix cache), and move to another token-capable server otherwise
    (`atropos.inference.routing`). `dedicated_server()` gives one that holds a unit of budget
    and never leaves its server.
    """

    def __init__(
        self,
        manager: ServerManager,
        slot: ServerSlot,
        *,
        held: Split | None = None,
        session: str | None = None,
    ) -> None:
        self._manager = manager
        self.slot = slot
        self.held = held
        self.session = session
        self._hint_kind = ""
        self._hint: str | None = None

    @property
    def config(self) -> APIServerConfig:
        """The configuration of the server calls currently go to."""
        return self.slot.config

    @property
    def backend(self) -> InferenceServer:
        """The backend calls currently go to."""
        return self.slot.backend

    @property
    def tokenizer(self) -> Any:
        """The backend's tokenizer, if it has one."""
        return getattr(self.slot.backend, "tokenizer", None)

    def __repr__(self) -> str:
        mode = f"holding a {self.held} unit" if self.held else "preferred"
        return f"<PinnedServer {mode} {self.slot!r}>"

    # The four calls return the manager's coroutine (await it): no frame of their own.

    def chat_completion(self, *, split: str = "train", **kwargs: Any) -> Awaitable[ChatCompletion]:
        """`ServerManager.chat_completion` on this server."""
        return self._manager._dispatch("chat_completion", split, kwargs, self)

    def completion(self, *, split: str = "train", **kwargs: Any) -> Awaitable[Completion]:
        """`ServerManager.completion` on this server."""
        return self._manager._dispatch("completion", split, kwargs, self)

    def tokens_and_logprobs_completion(
        self, *, split: str = "train", **kwargs: Any
    ) -> Awaitable[TokensAndLogprobs]:
        """`ServerManager.tokens_and_logprobs_completion` on this server."""
        return self._manager._dispatch("tokens_and_logprobs_completion", split, kwargs, self)

    def get_logprobs(self, *, split: str = "train", **kwargs: Any) -> Awaitable[PromptLogprobs]:
        """`ServerManager.get_logprobs` on this server."""
        return self._manager._dispatch("get_logprobs", split, kwargs, self)

    def hint(self, slot: ServerSlot) -> str | None:
        """The session hint header lines for `slot`'s server (made once per server type, from
        that type's lines formatted once per process: `_hint_lines`)."""
        kind = slot.config.server_type
        if self._hint_kind != kind:
            self._hint = _hint_lines(kind, self.session) if self.session is not None else None
            self._hint_kind = kind
        return self._hint


_HINT_PARTS: dict[str, list[str] | None] = {}
"""`routing.header_lines` of each server type, split where the key goes (made once per type)."""


def _hint_lines(kind: str, key: str) -> str | None:
    r"""`routing.header_lines(kind, key)`, by one join of that type's lines made once (a session
    is made per rollout; formatting its lines anew cost about 1 us).

    >>> _hint_lines("vllm", "k1"), _hint_lines("openai", "k1")
    ('X-Session-ID: k1\r\n', None)
    """
    if kind not in _HINT_PARTS:
        lines = header_lines(kind, "\0")  # no header name or line holds a NUL
        _HINT_PARTS[kind] = lines.split("\0") if lines is not None else None
    parts = _HINT_PARTS[kind]
    return key.join(parts) if parts is not None else None


class _Session:
    """`async with manager.managed_server(...)`: the `ManagedServer`, reset on exit (and its
    session's home forgotten, unless the caller named the session: it may come back). A plain
    class: entered once per rollout, and cheaper than a generator-based context manager."""

    __slots__ = ("_managed", "_homes", "_key")

    def __init__(self, managed: Any, homes: SessionHomes | None, key: str) -> None:
        self._managed = managed
        self._homes = homes
        self._key = key

    async def __aenter__(self) -> Any:
        return self._managed

    async def __aexit__(self, *exc: object) -> None:
        self._managed.reset()  # always a `ManagedServer` (`managed_server`)
        if self._homes is not None:
            self._homes.forget(self._key)


class ServerManager:
    """Routes calls over inference servers; an async context manager (`aclose()` on exit).

    Use one manager from one event loop (its waiters and probe tasks belong to that loop).

    Args:
        configs: the servers (`APIServerConfig` or a list of them), or a bare `ServerBaseline`
            to discover them (Slurm when `manager.slurm`, else localhost:9004-9007).
        manager: routing, retry and health settings.
        tokenizer: handed to every backend (used where a backend needs one: TRL, text prompts).
        environ: the environment for Slurm discovery (default: `os.environ`).
        reasoning: the environment's reasoning settings (`Reasoning.of(env_config)`), applied
            to every chat request and every `managed_server` session the way each server
            takes them (`atropos.inference.reasoning`); what a server cannot take is logged
            once, here.
        role: whose servers these are, named in the messages about them: "policy" (the
            env's own), "teacher" or "judge". When every server has been unreachable for
            `server_wait` seconds in a row, calls fail with a fatal error that names the role,
            the URLs, how long and the last error, and the env runners stop the run with it
            (`atropos.inference.pool`).
    """

    def __init__(
        self,
        configs: Sequence[APIServerConfig] | APIServerConfig | ServerBaseline,
        manager: ServerManagerConfig | None = None,
        *,
        tokenizer: Any = None,
        environ: Mapping[str, str] | None = None,
        reasoning: Reasoning | None = None,
        role: str = "policy",
    ) -> None:
        self.config = manager or ServerManagerConfig()
        server_configs = resolve_server_configs(configs, self.config, environ)
        self.servers: list[InferenceServer] = [
            create_backend(c, tokenizer=tokenizer) for c in server_configs
        ]
        self.reasoning = reasoning
        self._warn = WarnOnce()
        self._chat_plans: list[ChatPlan] | None = None
        if reasoning is not None:
            self._chat_plans = [
                ChatPlan.for_server(reasoning, c, self._warn) for c in server_configs
            ]
        self._templates: dict[int, tuple[Any, TemplatePlan]] = {}
        self._single: ManagedServer | None = None  # `single_turn`'s (for its last tokenizer)
        self.retry = RetryPolicy(
            self.config.max_attempts, self.config.retry_backoff, self.config.retry_backoff_max
        )
        self.deadline = self.config.deadline or max(c.timeout for c in server_configs)
        self._pool = ServerPool(
            self.servers,
            health_interval=self.config.health_check_interval,
            health_timeout=self.config.health_check_timeout,
            server_wait=self.config.server_wait or DEFAULT_SERVER_WAIT,
            role=role,
            adaptive_floor=self.config.adaptive_floor if self.config.adaptive_concurrency else None,
            adaptive_interval=self.config.adaptive_interval,
        )
        #: Each session's home server (`atropos.inference.routing`).
        self.homes = SessionHomes()
        #: The servers' own TTFT and queue-time histograms (`server_metrics`).
        self.server_metrics = ServerMetrics(server_configs)
        self._sticky = self.config.routing == "sticky_least_loaded"
        self._ratio = self.config.rehome_load_ratio
        self._weight = 1.0
        self._closed = False
        self._ready = False  # open, its pool started: a training call skips `_check_open`
        self._only: dict[str, frozenset[int]] = {}
        self._most = self.config.max_n_completions
        self._running: tuple[asyncio.AbstractEventLoop, int] | None = None

    def __repr__(self) -> str:
        slots = self._pool.slots
        healthy = sum(s.healthy for s in slots)
        plural = "" if len(slots) == 1 else "s"
        return (
            f"<ServerManager {len(slots)} server{plural}, {healthy} healthy, "
            f"weight {self._weight:g}: {slots}>"
        )

    async def __aenter__(self) -> ServerManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the health probes and the servers' histogram read, close every server's
        connections."""
        self._closed = True
        self._ready = False
        await self.server_metrics.aclose()
        await self._pool.aclose()
        await asyncio.gather(*(b.aclose() for b in self.servers))

    # -- the four calls ----------------------------------------------------------------------

    async def chat_completion(
        self, *, split: str = "train", session: str | None = None, **kwargs: Any
    ) -> ChatCompletion:
        """An OpenAI chat completion from the least-loaded healthy server (kwargs as OpenAI's).

        `session`: a conversation's key; its calls stay on one server (`routing`), as every
        one of the four calls'.
        """
        result: ChatCompletion = await self._dispatch(
            "chat_completion", split, kwargs, None, session
        )
        return result

    async def completion(
        self, *, split: str = "train", session: str | None = None, **kwargs: Any
    ) -> Completion:
        """An OpenAI text completion from the least-loaded healthy server."""
        result: Completion = await self._dispatch("completion", split, kwargs, None, session)
        return result

    def tokens_and_logprobs_completion(
        self, *, split: str = "train", session: str | None = None, **kwargs: Any
    ) -> Awaitable[TokensAndLogprobs]:
        """`(prompt_tokens, [output_tokens], [output_logprobs], [finish_reasons])`.

        kwargs: `prompt=` or `input_ids=`, `n`, `max_tokens` (or `max_new_tokens` /
        `max_completion_tokens`), and sampling kwargs (`temperature`, `top_p`, `stop`, ...).
        Returns the call's coroutine (await it): no frame of its own on the token path, which
        every rollout's call takes (`single_turn`), as `PinnedServer`'s four calls.
        """
        return self._dispatch("tokens_and_logprobs_completion", split, kwargs, None, session)

    async def get_logprobs(
        self, *, split: str = "train", session: str | None = None, **kwargs: Any
    ) -> PromptLogprobs:
        """Top-k logprobs of every prompt position (`prompt=` or `input_ids=`, `top_k=1`)."""
        result: PromptLogprobs = await self._dispatch("get_logprobs", split, kwargs, None, session)
        return result

    # -- sessions ----------------------------------------------------------------------------

    def managed_server(
        self,
        tokenizer: Any = None,
        *,
        base_url: str | None = None,
        session: str | None = None,
        **kwargs: Any,
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """A `ManagedServer` (token-exact session) on the least-loaded healthy token server.

        Use as `async with manager.managed_server(tokenizer) as managed:`. `base_url` picks a
        specific server; extra kwargs go to `ManagedServer`. Its `reset()` runs on exit, so read
        its state inside the block. The session renders with this manager's reasoning settings
        (`template_plan`). Its calls stay on one server (`routing`); `session` names it (a proxy
        session's or an agent rollout's key), so that later `managed_server` or plain calls
        with the same key find the same server; without one it gets a fresh key, forgotten on
        exit.
        """
        from atropos.inference.managed import ManagedServer

        if not self._ready:
            self._check_open("train")
        only = self._eligible("tokens_and_logprobs_completion")
        slots = self._pool.slots
        key = session if session is not None else new_session_key()
        home = self.homes.get(key) if session is not None and self._sticky else None
        if base_url is not None:
            matches = [s for s in slots if s.config.base_url == base_url]
            if not matches or matches[0].index not in only:
                raise ValueError(f"no token-capable server at {base_url!r}; have {self!r}")
            slot = matches[0]
        elif len(slots) == 1 and slots[0].index in only:
            slot = slots[0]  # one server: nothing to choose (the common case, once per rollout)
        elif home is not None and home in only:
            slot = slots[home]
        else:
            healthy = [s for s in slots if s.index in only and s.healthy]
            candidates = healthy or [s for s in slots if s.index in only]
            slot = min(candidates, key=lambda s: (s.load("train"), s.index))
        pinned = PinnedServer(self, slot, session=key)  # its first call makes a home
        renders_with = tokenizer if tokenizer is not None else pinned.tokenizer
        if self.reasoning is not None and renders_with is not None and "reasoning" not in kwargs:
            kwargs["reasoning"] = self.template_plan(renders_with)
        forget = self.homes if session is None and self._sticky else None
        return _Session(ManagedServer(pinned, tokenizer, **kwargs), forget, key)

    def single_turn(self, tokenizer: Any, **kwargs: Any) -> Coroutine[Any, Any, ChatTurn]:
        """`ManagedServer.chat_turn(**kwargs)` of a new conversation whose nodes nobody
        continues (a single-turn env's group: one request), without a session.

        `managed_server` makes a `ManagedServer`, a `PinnedServer`, a session key and a home
        per rollout, for a conversation of one call; here one `ManagedServer` per tokenizer
        (the last one asked for) makes every such call and holds nothing (`hold=False`). The
        call is routed as a plain call: the least-loaded server at call time, no session hint
        (a key no later call would carry tells a router nothing). Returns the `ChatTurn`'s
        coroutine."""
        managed = self._single
        if managed is None or managed.tokenizer is not tokenizer:
            from atropos.inference.managed import ManagedServer

            plan = self.template_plan(tokenizer) if self.reasoning is not None else None
            managed = self._single = ManagedServer(self, tokenizer, reasoning=plan)
        return managed.chat_turn(hold=False, **kwargs)

    def template_plan(self, tokenizer: Any) -> TemplatePlan:
        """The chat-template kwargs and reasoning budget of token-level generation with
        `tokenizer`, made once per tokenizer (what it cannot carry is logged then)."""
        held = self._templates.get(id(tokenizer))
        if held is not None and held[0] is tokenizer:
            return held[1]
        plan = TemplatePlan.for_tokenizer(self.reasoning, tokenizer, self._warn)
        self._templates[id(tokenizer)] = (tokenizer, plan)
        return plan

    @contextlib.asynccontextmanager
    async def dedicated_server(self, split: str = "train") -> AsyncIterator[PinnedServer]:
        """Hold one unit of `split` budget on the least-loaded server; calls stay there."""
        held = self._check_open(split)
        loop = asyncio.get_running_loop()
        slot = await self._pool.acquire(held, loop.time() + self.deadline)
        try:
            yield PinnedServer(self, slot, held=held)
        finally:
            await self._pool.release(slot, held)

    # -- capacity and metrics ----------------------------------------------------------------

    def update_weight(self, weight: float) -> None:
        """Use this share of every server's budgets: capacity = max(1, configured * weight)."""
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
        self._weight = weight
        for slot in self._pool.slots:
            slot.weight = weight
        self._pool.wake_all()

    def metrics(self) -> dict[str, float]:
        """Per-server metrics for logging (every server, upstream's `server/server_{i}_*` names)."""
        out: dict[str, float] = {}
        for slot in self._pool.slots:
            prefix = f"server/server_{slot.index}"
            out.update(slot.stats.snapshot(prefix))
            out[f"{prefix}_healthy"] = float(slot.healthy)
            for split in SPLITS:
                tag = "" if split == "train" else "eval_"
                out[f"{prefix}_{tag}in_flight"] = float(slot.in_flight[split])
                out[f"{prefix}_{tag}capacity"] = float(slot.capacity(split))
            out[f"{prefix}_sessions"] = float(self.homes.per_server[slot.index])
            limit = slot.limit
            if limit is not None:  # adaptive concurrency: the cap now and what moved it
                out[f"{prefix}_concurrency_limit"] = float(limit.value)
                out[f"{prefix}_concurrency_max"] = float(slot.base_capacity("train"))
                out[f"{prefix}_concurrency_grown"] = float(limit.grown)
                out[f"{prefix}_concurrency_shrunk"] = float(limit.shrunk)
                if limit.waiting >= 0:
                    out[f"{prefix}_queue_waiting"] = limit.waiting
                if limit.kv_usage >= 0:
                    out[f"{prefix}_kv_cache_usage"] = limit.kv_usage
        out["server/healthy_servers"] = float(sum(s.healthy for s in self._pool.slots))
        out["server/weight"] = self._weight
        out["server/sessions_rehomed"] = float(self.homes.rehomed)
        return out

    def server_report(self) -> list[dict[str, Any]]:
        """Each server now, as the env sends it to the API (`wire.ServerGauge`): URL, health,
        training requests in flight, the cap in force, the configured maximum, sessions homed
        there, its queue and KV-cache gauges when adaptive concurrency read them, and its TTFT
        quantiles when its histograms were read (`server_metrics`)."""
        out: list[dict[str, Any]] = []
        for slot in self._pool.slots:
            row: dict[str, Any] = {
                "url": slot.config.base_url[:300],
                "healthy": slot.healthy,
                "in_flight": slot.in_flight["train"],
                "capacity": slot.capacity("train"),
                "max": slot.base_capacity("train"),
                "sessions": max(0, self.homes.per_server[slot.index]),
            }
            limit = slot.limit
            if limit is not None and limit.waiting >= 0:
                row["waiting"] = limit.waiting
            if limit is not None and limit.kv_usage >= 0:
                row["kv_usage"] = limit.kv_usage
            row.update(self.server_metrics.row(slot.index))
            out.append(row)
        return out[:64]

    # -- routing -----------------------------------------------------------------------------

    def _check_open(self, split: str) -> Split:
        if self._closed:
            raise RuntimeError("this ServerManager is closed")
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self._pool.start()
        self._ready = True
        return "train" if split == "train" else "eval"

    def _eligible(self, method: str) -> frozenset[int]:
        only = self._only.get(method)
        if only is None:
            flag = NEEDS.get(method)
            slots = self._pool.slots
            only = frozenset(s.index for s in slots if flag is None or getattr(s.backend, flag))
            self._only[method] = only
        if not only:
            slots = self._pool.slots
            kinds = sorted({s.config.server_type for s in slots})
            raise UnsupportedOperation(
                f"{method} needs a server of type vllm or sglang"
                f"{' or trl' if method == 'tokens_and_logprobs_completion' else ''}; "
                f"configured: {kinds}"
            )
        return only

    def _dispatch(
        self,
        method: str,
        split: str,
        kwargs: dict[str, Any],
        pin: PinnedServer | None,
        session: str | None = None,
    ) -> Awaitable[Any]:
        """The call's coroutine: `_call`, or, for `n` above `max_n_completions`, `_chunked`."""
        n = kwargs.get("n")
        if method == "get_logprobs" or n is None or (type(n) is int and n <= self._most):
            return self._call(method, split, kwargs, pin, session)
        return self._chunked(method, split, kwargs, pin, session)

    async def _chunked(
        self,
        method: str,
        split: str,
        kwargs: dict[str, Any],
        pin: PinnedServer | None,
        session: str | None,
    ) -> Any:
        """`n` above `max_n_completions` as concurrent chunks, merged in order."""
        self._check_open(split)
        n = int(kwargs.get("n") or 1)
        most = self._most
        if n <= most:
            return await self._call(method, split, kwargs, pin, session)
        sizes = [most] * (n // most) + ([n % most] if n % most else [])
        parts = await gather_or_cancel(
            self._call(method, split, {**kwargs, "n": size}, pin, session) for size in sizes
        )
        if method == "tokens_and_logprobs_completion":
            return (
                parts[0][0],
                [ids for p in parts for ids in p[1]],
                [lps for p in parts for lps in p[2]],
                [reason for p in parts for reason in p[3]],
            )
        return merge_completions(parts)

    def _home(self, key: str | None, tried: set[int]) -> ServerSlot | None:
        """The session's home server, unless it failed this call (None: sticky routing is off,
        no session, or its first call)."""
        index = self.homes.get(key) if key is not None and self._sticky else None
        return None if index is None or index in tried else self._pool.slots[index]

    def _placed(self, slot: ServerSlot, pin: PinnedServer | None, key: str | None) -> None:
        """The attempt goes to `slot`: the pin follows, and it becomes the session's home."""
        if pin is not None:
            pin.slot = slot
        if key is not None and self._sticky:
            self.homes.set(key, slot.index)

    def _take(
        self,
        split: Split,
        pin: PinnedServer | None,
        key: str | None,
        tried: set[int],
        only: frozenset[int],
    ) -> ServerSlot | None:
        """The server of one attempt when one has room now (a unit of budget taken on it),
        else None (`_wait_for_room`): the session's home (`routing`) or the least-loaded server,
        which becomes the session's home. Not for a dedicated pin (its unit is held)."""
        if key is None or not self._sticky:  # no home to prefer or keep (`_home`, `_placed`)
            slot = self._pool.take(split, avoid=tried, only=only)
            if slot is not None and pin is not None:
                pin.slot = slot
            return slot
        home = self._home(key, tried)
        slot = self._pool.take(
            split,
            prefer=home,
            avoid=tried,
            only=only,
            ratio=self._ratio if home is not None else math.inf,
            spread=self.homes.per_server,
        )
        if slot is not None:
            self._placed(slot, pin, key)
        return slot

    async def _wait_for_room(
        self,
        split: Split,
        deadline: float,
        pin: PinnedServer | None,
        key: str | None,
        tried: set[int],
        only: frozenset[int],
    ) -> ServerSlot:
        """`_take` when no server had room: wait for a unit until `deadline`."""
        home = self._home(key, tried)
        slot = await self._pool.acquire(
            split,
            deadline,
            prefer=home,
            avoid=tried,
            only=only,
            ratio=self._ratio if home is not None else math.inf,
            spread=self.homes.per_server if key is not None and self._sticky else None,
        )
        self._placed(slot, pin, key)
        return slot

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, kept from the last call made in this thread while it still runs
        (a thread runs one loop at a time): `asyncio.get_running_loop` asks the kernel for the
        process id on every call (Python 3.11), about 0.2 us of each inference call."""
        held, thread = self._running, get_ident()
        if held is not None and held[1] == thread and held[0].is_running():
            return held[0]
        loop = asyncio.get_running_loop()
        self._running = (loop, thread)
        return loop

    async def _call(
        self,
        method: str,
        split_name: str,
        kwargs: dict[str, Any],
        pin: PinnedServer | None,
        session: str | None = None,
    ) -> Any:
        """One call: pick a server, try, fail over and back off on retryable errors, all under
        one deadline (`base.Call`: set here once, read by every wait below, no timer re-armed)."""
        split: Split = (
            "train" if split_name == "train" and self._ready else self._check_open(split_name)
        )
        loop = self._loop()
        asked = loop.time()
        deadline = asked + self.deadline
        only = self._eligible(method)
        tried: set[int] = set()
        attempt = 0
        key = pin.session if pin is not None else session
        held = pin is not None and pin.held is not None
        plans = self._chat_plans if method == "chat_completion" else None
        while True:
            attempt += 1
            slot = pin.slot if held and pin else self._take(split, pin, key, tried, only)
            started = asked  # taken at once: no clock read between
            if slot is None:
                slot = await self._wait_for_room(split, deadline, pin, key, tried, only)
                started = loop.time()
            tried.add(slot.index)
            if key is None:
                hint = None
            elif pin is not None:  # its lines for this server, made once per session
                hint = pin.hint(slot)
            else:
                hint = _hint_lines(slot.config.server_type, key)
            scope = CURRENT_CALL.set(Call(deadline, hint))
            try:  # the backend's call; a chat request gets that server's reasoning fields
                call = getattr(slot.backend, method)(
                    **(kwargs if plans is None else plans[slot.index].apply(kwargs))
                )
                result = await (call if slot.keeps_deadline else within(deadline, call))
            except InferenceError as error:
                wait = self._after_error(slot, error, attempt, only, tried, deadline)
            except TimeoutError:
                raise self._timed_out(slot, method, attempt) from None
            else:
                slot.stats.record(split, loop.time() - started, attempt, started - asked)
                slot.answered = True
                return result
            finally:
                CURRENT_CALL.reset(scope)
                if not held:
                    slot.in_flight[split] -= 1
                    if self._pool.waiters[split]:  # wake one waiter for the unit given back
                        await self._pool.notify(split)
            if wait:
                await asyncio.sleep(wait)
            asked = loop.time()

    def _timed_out(self, slot: ServerSlot, method: str, attempt: int) -> InferenceTimeout:
        """The error of a call whose deadline passed (counted as a timeout of `slot`)."""
        slot.stats.errors["timeout"] += 1
        return InferenceTimeout(
            f"{method}: no result within the {self.deadline:g} s deadline "
            f"({attempt} attempt{'s' if attempt > 1 else ''})",
            server=slot.config.base_url,
        )

    def _after_error(
        self,
        slot: ServerSlot,
        error: InferenceError,
        attempt: int,
        only: frozenset[int],
        tried: set[int],
        deadline: float,
    ) -> float:
        """Count a failed attempt, and how long to wait before the next (0: fail over now);
        re-raises `error` when it is final: not retryable, out of attempts or of time."""
        slot.stats.errors[error.kind] += 1
        self._pool.mark_failed(slot, error)
        if not error.retryable or attempt >= self.retry.max_attempts:
            raise error
        failover = any(
            s.healthy and s.index in only and s.index not in tried for s in self._pool.slots
        )
        wait = 0.0 if failover else self.retry.delay(attempt, error.retry_after)
        if asyncio.get_running_loop().time() + wait >= deadline:
            raise error
        return wait
