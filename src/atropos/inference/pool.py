"""The servers behind a `ServerManager`: capacity per split, health, choice, rolling metrics.

Each server has two budgets, one for training requests (`num_max_requests_at_once`) and one for
evaluation requests (`num_requests_for_eval`), both scaled by the manager's weight. A request
takes one unit of its split's budget on the least-loaded healthy server (in-flight / capacity);
when none has room it waits on that split's `asyncio.Condition` until a release or a health or
weight change wakes it (no polling). Health is probed with the backend's cheap GET
(`check_health`), by one task per server started lazily and cancelled by `aclose()`. A probe
that times out while calls to the same server succeed does not mark it down: the late answer is
our own event loop's backlog (measured: 16,384 multi-turn rollouts in one process kept the loop
busy past the 5 s probe timeout, and both healthy servers were taken out). A session's
call prefers its home server within a load ratio (`pick(prefer=, ratio=)`, `routing`); with
adaptive concurrency the training budget is also capped by the server's `AdaptiveLimit`, moved
by one more task per server (`concurrency.Pacer`).

While no server a call may use is healthy, the call waits for one until those servers have all
been unreachable for `server_wait` seconds in a row (an outage: counted from when the last of
them went down; one coming back starts the count again), and each unhealthy server's probe logs
every `note_every` seconds for how long and why. Then the call raises `kind="unavailable"` marked
`fatal`, and the runners stop the run with its one message (`errors.fatal_reason`), which names
the role (policy, teacher, judge), the URLs, how long and the last error, or, for servers that
never answered, says to check the address. One setting serves as both deadlines: while every
server is down no call can be served, so failing calls earlier would only lose items. A restart
shorter than `server_wait` (60 s; 300 s in serve mode) changes nothing. Servers without a probe
(`health_check` off) are never marked down, so this rule never stops their runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Set
from typing import Any

from atropos.inference.base import InferenceServer, Split, within
from atropos.inference.concurrency import AdaptiveLimit, Pacer
from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError
from atropos.inference.latency import note_call
from atropos.inference.routing import within_ratio

log = logging.getLogger(__name__)
SPLITS: tuple[Split, Split] = ("train", "eval")


class ServerStats:
    """Rolling per-split latency and attempt windows (bounded), and error counts by kind."""

    def __init__(self, window: int) -> None:
        self.latency: dict[Split, deque[float]] = {s: deque(maxlen=window) for s in SPLITS}
        self.attempts: dict[Split, deque[int]] = {s: deque(maxlen=window) for s in SPLITS}
        self.requests: Counter[Split] = Counter()
        self.errors: Counter[str] = Counter()

    def record(self, split: Split, latency: float, attempts: int, waited: float = 0.0) -> None:
        """One successful call: the successful attempt's latency and the call's attempts here,
        and its wait for a slot and the server's time in the env's stages (`latency.note_call`,
        training calls only): every sample of a call in one call."""
        self.latency[split].append(latency)
        self.attempts[split].append(attempts)
        self.requests[split] += 1
        if split == "train":
            note_call(split, waited, latency)

    def snapshot(self, prefix: str) -> dict[str, float]:
        """Upstream's W&B names (`server/server_{i}_request_time_avg`, ...) plus errors."""
        out: dict[str, float] = {}
        for split in SPLITS:
            tag = "" if split == "train" else "eval_"
            lat = sorted(self.latency[split])
            if lat:
                out[f"{prefix}_{tag}request_time_avg"] = statistics.fmean(lat)
                out[f"{prefix}_{tag}request_time_std"] = statistics.pstdev(lat)
                out[f"{prefix}_{tag}request_time_99p"] = lat[math.ceil(0.99 * len(lat)) - 1]
                out[f"{prefix}_{tag}average_num_attempts"] = statistics.fmean(self.attempts[split])
            out[f"{prefix}_{tag}requests"] = float(self.requests[split])
        out[f"{prefix}_errors"] = float(sum(self.errors.values()))
        for kind, count in sorted(self.errors.items()):
            out[f"{prefix}_errors_{kind}"] = float(count)
        return out


class ServerSlot:
    """One server: its backend, budgets, in-flight counts, health and stats."""

    def __init__(self, index: int, backend: InferenceServer) -> None:
        self.index = index
        self.backend = backend
        self.stats = ServerStats(backend.config.rolling_buffer_length)
        self.healthy = True
        self.answered = False  # a probe passed or a call succeeded at least once
        self.down_since: float | None = None  # loop time it was last marked unhealthy
        self.why = ""  # why it was last marked unhealthy
        self.weight = 1.0
        self.in_flight: Counter[Split] = Counter(dict.fromkeys(SPLITS, 0))  # no __missing__
        #: The adaptive cap on training requests (`atropos.inference.concurrency`), when on.
        self.limit: AdaptiveLimit | None = None
        #: The backend bounds its waits by the call's deadline (`base.Call`): no timer around it.
        self.keeps_deadline = bool(getattr(backend, "keeps_deadline", False))

    @property
    def config(self) -> APIServerConfig:
        """The server's configuration."""
        return self.backend.config

    def base_capacity(self, split: Split) -> int:
        """This split's configured budget: max(1, configured * weight)."""
        cfg = self.backend.config
        base = cfg.num_max_requests_at_once if split == "train" else cfg.num_requests_for_eval
        return max(1, int(base * self.weight))

    def capacity(self, split: Split) -> int:
        """This split's budget: the configured one, capped by the adaptive limit (training)."""
        base = self.base_capacity(split)
        limit = self.limit
        if limit is None or split != "train":
            return base
        return max(1, min(base, limit.value))

    def has_room(self, split: Split) -> bool:
        """Healthy, and fewer requests of this split in flight than its budget."""
        return self.healthy and self.in_flight[split] < self.capacity(split)

    def load(self, split: Split) -> float:
        """In-flight requests of this split per unit of its budget."""
        return self.in_flight[split] / self.capacity(split)

    def __repr__(self) -> str:
        state = "healthy" if self.healthy else "UNHEALTHY"
        return (
            f"<server {self.index} {self.config.server_type} {self.config.base_url} {state} "
            f"train {self.in_flight['train']}/{self.capacity('train')} "
            f"eval {self.in_flight['eval']}/{self.capacity('eval')}>"
        )


class ServerPool:
    """Capacity accounting, least-loaded choice and health probing over `ServerSlot`s."""

    def __init__(
        self,
        backends: list[InferenceServer],
        *,
        health_interval: float,
        health_timeout: float,
        server_wait: float = 60.0,
        note_every: float = 10.0,
        role: str = "policy",
        adaptive_floor: int | None = None,
        adaptive_interval: float = 1.0,
    ) -> None:
        self.slots = [ServerSlot(i, b) for i, b in enumerate(backends)]
        if adaptive_floor is not None:  # adaptive concurrency on: every server starts at it
            for slot in self.slots:
                slot.limit = AdaptiveLimit(adaptive_floor)
        self.adaptive_interval = adaptive_interval
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.server_wait = server_wait
        self.note_every = note_every
        self.role = role  # whose servers these are, for messages: "policy", "teacher", "judge"
        self._room = {s: asyncio.Condition() for s in SPLITS}
        #: How many calls wait for a unit of each split's budget (read per call: a plain count).
        self.waiters: Counter[Split] = Counter(dict.fromkeys(SPLITS, 0))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self._closing = False

    def start(self) -> None:
        """Start one health probe task per server that wants one (idempotent; needs a loop)."""
        if self._started:
            return
        self._started = True
        self._closing = False
        for slot in self.slots:
            if slot.config.health_check:
                self._spawn(self._watch(slot), f"health:{slot.config.base_url}")
            if slot.limit is not None:
                pacer = Pacer(self, slot, self.adaptive_interval)
                self._spawn(pacer.run(), f"pace:{slot.config.base_url}")

    @property
    def closing(self) -> bool:
        """True once `aclose()` began: the background tasks end."""
        return self._closing

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Cancel the probe tasks and wait for them. A probe whose cancellation was swallowed
        (Python 3.11's `asyncio.wait_for` can lose a cancel that lands as its inner call ends)
        still stops, at its next turn: `_closing` ends its loop."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._started = False

    def pick(
        self,
        split: Split,
        prefer: ServerSlot | None = None,
        avoid: Set[int] = frozenset(),
        only: Set[int] | None = None,
        ratio: float = math.inf,
        spread: Mapping[int, int] | None = None,
    ) -> ServerSlot | None:
        """`prefer` if it has room, else the least-loaded server with room, untried ones first.

        `only` restricts the choice to those server indices (e.g. servers with token ids).
        With a finite `ratio`, `prefer` is taken only while it is within that ratio of the
        least-loaded server's load (`routing.within_ratio`, counting this request on both).
        `spread` (sessions per server) breaks ties of load: a new session goes where fewer
        sessions live.
        """
        if prefer is not None and (
            not prefer.has_room(split)
            or prefer.index in avoid
            or (only is not None and prefer.index not in only)
        ):
            prefer = None
        if prefer is not None and ratio == math.inf:
            return prefer
        best: ServerSlot | None = None
        best_key: tuple[bool, float, int, int] = (True, math.inf, 0, 0)
        for slot in self.slots:  # one pass: this runs for every request
            if (only is not None and slot.index not in only) or not slot.has_room(split):
                continue
            key = (
                slot.index in avoid,
                slot.load(split),
                spread[slot.index] if spread is not None else 0,
                sum(slot.in_flight.values()),
            )
            if key < best_key:
                best, best_key = slot, key
        if prefer is not None and best is not None and best is not prefer:
            home = (prefer.in_flight[split] + 1) / prefer.capacity(split)
            least = (best.in_flight[split] + 1) / best.capacity(split)
            if within_ratio(home, least, ratio):
                return prefer
        return best if best is not None else prefer

    async def acquire(
        self,
        split: Split,
        deadline: float,
        *,
        prefer: ServerSlot | None = None,
        avoid: Set[int] = frozenset(),
        only: Set[int] | None = None,
        ratio: float = math.inf,
        spread: Mapping[int, int] | None = None,
    ) -> ServerSlot:
        """Take one unit of `split` budget on a healthy server, waiting until `deadline`.

        `avoid` is read when a waiter wakes up, not copied: pass a set nobody changes meanwhile.
        """
        slot = self.take(split, prefer=prefer, avoid=avoid, only=only, ratio=ratio, spread=spread)
        if slot is None:
            slot = await self._wait(split, deadline, prefer, avoid, only, ratio, spread)
            self._count(slot, split)
        return slot

    def take(
        self,
        split: Split,
        *,
        prefer: ServerSlot | None = None,
        avoid: Set[int] = frozenset(),
        only: Set[int] | None = None,
        ratio: float = math.inf,
        spread: Mapping[int, int] | None = None,
    ) -> ServerSlot | None:
        """`acquire` without waiting: the unit on the server `pick` chooses, or None when no
        server has room now (then `acquire` waits for one). With one server there is nothing to
        choose: it, when it may be used and has room (what `pick` gives then, without its pass)."""
        slots = self.slots
        if len(slots) == 1:
            slot: ServerSlot | None = slots[0]
            if (only is not None and slots[0].index not in only) or not slots[0].has_room(split):
                slot = None
        else:
            slot = self.pick(split, prefer, avoid, only, ratio, spread)
        if slot is not None:
            self._count(slot, split)
        return slot

    def _count(self, slot: ServerSlot, split: Split) -> None:
        count = slot.in_flight[split] + 1
        slot.in_flight[split] = count
        limit = slot.limit
        if limit is not None and split == "train" and count > limit.peak:
            limit.peak = count

    async def _wait(
        self,
        split: Split,
        deadline: float,
        prefer: ServerSlot | None,
        avoid: Set[int],
        only: Set[int] | None,
        ratio: float,
        spread: Mapping[int, int] | None,
    ) -> ServerSlot:
        loop = asyncio.get_running_loop()
        room = self._room[split]
        async with room:
            self.waiters[split] += 1
            try:
                while (slot := self.pick(split, prefer, avoid, only, ratio, spread)) is None:
                    limit = deadline
                    outage = self.outage_since(only)
                    if outage is not None:  # every server it may use is down: an outage
                        if loop.time() >= outage + self.server_wait:
                            raise self._unreachable(only, loop.time() - outage)
                        limit = min(deadline, outage + self.server_wait)
                    remaining = limit - loop.time()
                    if remaining <= 0:
                        raise self._unavailable(split)
                    try:  # not wait_for: see `within` (all waiters of an outage time out
                        # together, and the runner cancels them as the first one stops the run)
                        await within(loop.time() + remaining, room.wait())
                    except TimeoutError:
                        pass  # the loop re-checks, then gives up
                return slot
            except BaseException:
                if self.pick(split) is not None:
                    room.notify(1)  # we may have swallowed a wake-up meant for a slot: pass it on
                raise
            finally:
                self.waiters[split] -= 1

    def _unavailable(self, split: Split) -> InferenceError:
        healthy = sum(s.healthy for s in self.slots)
        return InferenceError(
            f"no server had room for a {split} request before the deadline "
            f"({healthy}/{len(self.slots)} healthy: {self.slots})",
            retryable=True,
            kind="unavailable",
        )

    def outage_since(self, only: Set[int] | None = None) -> float | None:
        """Loop time since which every server in `only` (default: all) is unhealthy, i.e. when
        the last of them went down; None while one of them is healthy."""
        slots = [s for s in self.slots if only is None or s.index in only]
        if not slots or any(s.healthy or s.down_since is None for s in slots):
            return None
        return max(s.down_since for s in slots if s.down_since is not None)

    def _unreachable(self, only: Set[int] | None, down: float) -> InferenceError:
        """The fatal error of an outage of every server in `only` that lasted `down` seconds."""
        slots = [s for s in self.slots if only is None or s.index in only]
        if not any(s.answered for s in slots):  # a wrong address, or a server never started
            where = "; ".join(f"{s.config.base_url}{s.why}" for s in slots)
            message = (
                f"no inference server was healthy for {self.server_wait:g} s ({where}); check"
                " that the server is running and --openai.base_url (the address ends in /v1"
                " for OpenAI-compatible servers) (--server_wait sets how long to wait)"
            )
        else:
            one = len(slots) == 1
            whose = f"the {self.role}'s inference server{'' if one else 's'}"
            urls = ", ".join(s.config.base_url for s in slots)
            why = "; ".join(dict.fromkeys(s.why.removeprefix(": ") for s in slots if s.why))
            message = (
                f"{whose} ({urls}) {'has' if one else 'have'} been unreachable for {down:.0f} s"
                f"{f' ({why})' if why else ''}; start {'it' if one else 'them'} again, or raise"
                f" --server_wait (now {self.server_wait:g} s) to wait longer"
            )
        return InferenceError(message, retryable=True, kind="unavailable", fatal=True)

    async def release(self, slot: ServerSlot, split: Split) -> None:
        """Give the unit back and wake one waiter of this split, if any."""
        slot.in_flight[split] -= 1
        if self.waiters[split]:
            await self.notify(split)

    async def notify(self, split: Split) -> None:
        """Wake one waiter of `split` (shielded: a cancelled caller still passes the unit on)."""
        await asyncio.shield(self._notify(split, 1))

    async def _notify(self, split: Split, count: int | None) -> None:
        room = self._room[split]
        async with room:
            if count is None:
                room.notify_all()
            else:
                room.notify(count)

    def wake_all(self) -> None:
        """Wake every waiter (capacity or health changed); safe from sync code in the loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, so nobody can be waiting
        for split in SPLITS:
            if self.waiters[split]:
                self._spawn(self._notify(split, None), f"wake:{split}")

    def set_health(self, slot: ServerSlot, healthy: bool, why: str = "") -> None:
        """Record a health change; a server coming back wakes the waiters."""
        if healthy:
            slot.answered = True
        elif why:
            slot.why = why  # the latest reason, for the messages
        if slot.healthy == healthy:
            return
        slot.healthy = healthy
        if healthy:
            slot.down_since = None
            log.info(
                "the %s's inference server %s is healthy again", self.role, slot.config.base_url
            )
        else:
            slot.down_since = asyncio.get_running_loop().time()
            log.warning(
                "the %s's inference server %s is unhealthy%s", self.role, slot.config.base_url, why
            )
        self.wake_all()  # back: waiters can go; down: waiters may now be in an outage

    def mark_failed(self, slot: ServerSlot, error: InferenceError) -> None:
        """After a connection failure, take the server out until its probe passes again."""
        if error.kind == "connection" and slot.config.health_check and self._started:
            self.set_health(slot, False, f": {error.message}")

    async def _watch(self, slot: ServerSlot) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        noted = loop.time()
        while not self._closing:
            answers = slot.stats.requests.total()
            ok = await slot.backend.check_health(timeout=self.health_timeout)
            error = getattr(slot.backend, "health_error", "")  # what the failed probe met
            if not ok and error.startswith("no answer") and slot.stats.requests.total() > answers:
                ok = True  # it answered calls meanwhile: our own loop was late, not the server
            self.set_health(slot, ok, f": health probe failed{f': {error}' if error else ''}")
            failures = 0 if ok else failures + 1
            now = loop.time()
            if slot.down_since is not None and now - noted >= self.note_every:
                noted = now
                log.warning(
                    "waiting for the %s's inference server %s: unreachable for %.0f s%s (the run"
                    " stops once all the %s's servers have been unreachable for %g s)",
                    self.role,
                    slot.config.base_url,
                    now - slot.down_since,
                    slot.why,
                    self.role,
                    self.server_wait,
                )
            delay = self.health_interval if ok else 0.25 * 2 ** min(failures - 1, 10)
            await asyncio.sleep(min(delay, self.health_interval))
