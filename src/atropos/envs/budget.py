"""A provider's budget: concurrency, requests and tokens per minute, and a circuit breaker.

The judge (`atropos.envs.judge`) sends every call through the `Provider` of its base URL (one
per URL and event loop, shared by every judge of the process that names it), so a storm of
judgments is paced before it reaches the provider instead of being answered with 429s.

- **Concurrency.** At most `max_concurrency` calls in flight (a semaphore, FIFO).
- **Rates.** `Rate` is a token bucket kept as a "theoretical arrival time" (GCRA): each call
  reserves its start time when it asks, so waiters go in order, nothing polls, and a call
  that could only start after its deadline is refused at once without spending budget. A
  bucket holds one second's worth of its rate (at least one request, or one call's tokens):
  in any window of `t` seconds at most `burst + rate * t` is spent (plus one call's overdraft
  for tokens), so a provider that counts per minute sees at most `rpm + rpm / 60` requests.
  Tokens are estimated before the call (`estimate_tokens`: the prompt's characters / 4, 4 per
  message, plus `max_tokens * n`) and corrected from the answer's `usage` after it.
- **Pauses.** A 429 with `Retry-After` pauses every call to the provider until then (calls
  that had reserved a start inside the pause reserve again after it), and the request bucket
  restarts from empty, so the provider is not met with a burst when the pause ends.
- **Circuit breaker.** `breaker_threshold` consecutive failures of the provider (connection,
  timeout, 5xx, an unreadable answer: not 429, which is pacing, nor another 4xx, which is the
  request's) open it: calls fail at once for `breaker_cooldown` seconds, then one probe is let
  through (half-open); its success closes the breaker, its failure opens it again.

>>> rate = Rate(per_minute=60)  # 1 per second, a burst of 1
>>> [rate.reserve(1, now=0.0), rate.reserve(1, now=0.0), rate.reserve(1, now=0.0)]
[0.0, 1.0, 2.0]
>>> rate.reserve(1, now=0.0, not_after=2.5) is None  # would start at 3.0: refused, not spent
True
>>> breaker = Breaker(threshold=2, cooldown=10.0)
>>> breaker.failed(0.0), breaker.failed(0.0), breaker.allow(5.0), breaker.allow(10.0)
(False, True, None, 'probe')
>>> breaker.allow(10.0), breaker.succeeded(), breaker.allow(10.0)  # one probe, then closed
(None, None, 'pass')
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from atropos.inference.base import within

log = logging.getLogger("atropos.env")

__all__ = [
    "Attempt",
    "Breaker",
    "Budget",
    "BudgetRefused",
    "Provider",
    "Rate",
    "estimate_tokens",
    "provider_for",
]


class Rate:
    """A token bucket of `per_minute` units, holding `burst` units (default: one second's
    worth, at least 1), kept as the time it is next full (GCRA; see the module docstring)."""

    def __init__(self, per_minute: float, burst: float | None = None) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute must be > 0, got {per_minute}")
        self.per_second = per_minute / 60.0
        self.burst = max(1.0, self.per_second if burst is None else burst)
        self.full_at = float("-inf")  # when the bucket is full again (nothing owed)

    def reserve(self, cost: float, now: float, not_after: float | None = None) -> float | None:
        """Reserve `cost` units; the time the call may start (>= `now`), or None (nothing
        reserved) when that would be after `not_after`. A cost above the burst waits for a
        full bucket and leaves it in debt."""
        start = self.ready_at(cost, now)
        if not_after is not None and start > not_after:
            return None
        self.full_at = max(self.full_at, start) + cost / self.per_second
        return start

    def ready_at(self, cost: float, now: float) -> float:
        """The earliest time (>= `now`) `cost` units could start, reserving nothing."""
        return max(now, self.full_at - max(0.0, self.burst - cost) / self.per_second)

    def adjust(self, delta: float) -> None:
        """Charge `delta` more units (a refund when negative) to the last reservations."""
        self.full_at += delta / self.per_second

    def empty_at(self, when: float) -> None:
        """Start from an empty bucket at `when`: the next unit is available then, the burst
        refills from there."""
        self.full_at = max(self.full_at, when + (self.burst - 1.0) / self.per_second)


class Breaker:
    """Consecutive failures open it; after `cooldown` seconds one probe may pass."""

    def __init__(self, threshold: int, cooldown: float) -> None:
        self.threshold = threshold  # 0: never opens
        self.cooldown = cooldown
        self.failures = 0  # consecutive
        self.opened_at: float | None = None  # None: closed
        self.probing = False

    def allow(self, now: float) -> str | None:
        """ "pass" or "probe" (the one call let through half-open) when a call may go now;
        None while open."""
        if self.opened_at is None:
            return "pass"
        if self.probing or now < self.opened_at + self.cooldown:
            return None
        self.probing = True
        return "probe"

    def succeeded(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def failed(self, now: float, probe: bool = False) -> bool:
        """Count a failure; True when it opens the breaker (or a failed probe reopens it)."""
        self.failures += 1
        if probe:
            self.probing = False
            self.opened_at = now
            return True
        if self.threshold > 0 and self.opened_at is None and self.failures >= self.threshold:
            self.opened_at = now
            return True
        return False

    def release(self, probe: bool) -> None:
        """A call that ended with no verdict on the provider (cancelled, limited, or the
        request's own fault): a probe may be taken again."""
        if probe:
            self.probing = False


@dataclass(frozen=True)
class Budget:
    """A provider's limits (0 turns a limit off)."""

    max_concurrency: int = 0
    rpm: float = 0
    tpm: float = 0
    breaker_threshold: int = 0
    breaker_cooldown: float = 30.0


class BudgetRefused(Exception):
    """No call now: `reason` is "breaker_open" or "deadline" (the deadline passes before the
    budget allows the call)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Attempt:
    """One admitted call: say how it went (`ok`, `limited`, `failed`); unsaid is neutral."""

    def __init__(self, provider: Provider, tokens: float, probe: bool) -> None:
        self.provider = provider
        self.tokens = tokens
        self.probe = probe
        self.settled = False

    def ok(self, used_tokens: float | None) -> None:
        """The provider answered; `used_tokens` (its `usage`) corrects the estimate."""
        p = self.provider
        if p.tpm is not None and used_tokens is not None:
            p.tpm.adjust(used_tokens - self.tokens)
        p.breaker.succeeded()
        p.stats["answered"] += 1
        self.settled = True

    def limited(self, retry_after: float | None, now: float) -> None:
        """A 429: pause the provider for `retry_after` seconds (when given)."""
        p = self.provider
        p.stats["http_429"] += 1
        if retry_after:
            p.pause_until(now + retry_after)
        p.breaker.release(self.probe)
        self.settled = True

    def failed(self, now: float) -> None:
        """The provider failed (counts toward the breaker)."""
        p = self.provider
        if p.breaker.failed(now, self.probe):
            p.stats["breaker_opened"] += 1
            log.warning(
                "judge %s: %d consecutive failures; no calls for %g s (circuit breaker open)",
                p.name,
                p.breaker.failures,
                p.breaker.cooldown,
            )
        self.settled = True


class Provider:
    """The shared budget of one judge provider (see the module docstring)."""

    def __init__(self, name: str, budget: Budget) -> None:
        self.name = name
        self.budget = budget
        self.gate = asyncio.Semaphore(budget.max_concurrency) if budget.max_concurrency else None
        self.rpm = Rate(budget.rpm) if budget.rpm else None
        self.tpm = Rate(budget.tpm) if budget.tpm else None
        self.breaker = Breaker(budget.breaker_threshold, budget.breaker_cooldown)
        self.paused_until = float("-inf")
        self.stats: Counter[str] = Counter()  # sent, answered, http_429, breaker_opened, ...
        self.warned = False

    def pause_until(self, when: float) -> None:
        self.paused_until = max(self.paused_until, when)
        if self.rpm is not None:
            self.rpm.empty_at(self.paused_until)

    @contextlib.asynccontextmanager
    async def attempt(self, tokens: float, deadline: float) -> AsyncIterator[Attempt]:
        """Admit one call of about `tokens` tokens before loop time `deadline`: the breaker,
        a concurrency slot, a pause, then both rates. Raises `BudgetRefused`."""
        loop = asyncio.get_running_loop()
        allowed = self.breaker.allow(loop.time())
        if allowed is None:
            self.stats["refused_breaker_open"] += 1
            raise BudgetRefused("breaker_open", f"judge {self.name}: circuit breaker open")
        probe = allowed == "probe"
        admitted: Attempt | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.gate is not None:
                    try:
                        await within(deadline, self.gate.acquire())
                    except asyncio.TimeoutError:
                        raise self._late("a concurrency slot") from None
                    stack.callback(self.gate.release)
                await self._wait_for_rates(tokens, deadline)
                self.stats["sent"] += 1
                admitted = Attempt(self, tokens, probe)
                yield admitted
        finally:
            if admitted is None or not admitted.settled:
                self.breaker.release(probe)

    async def _wait_for_rates(self, tokens: float, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            start = max(now, self.paused_until)
            if start > deadline:
                raise self._late("the end of a 429 pause")
            if self.rpm is not None:
                at = self.rpm.reserve(1, start, not_after=deadline)
                if at is None:
                    raise self._late("its requests-per-minute budget")
                start = at
            if self.tpm is not None:
                cost = min(tokens, self.budget.tpm)  # a call above a minute's worth can go
                at = self.tpm.reserve(cost, start, not_after=deadline)
                if at is None:
                    if self.rpm is not None:
                        self.rpm.adjust(-1)  # give the request back: it is not sent
                    raise self._late("its tokens-per-minute budget")
                start = at
            if start > now:
                await asyncio.sleep(start - now)
            if loop.time() >= self.paused_until:
                return
            # a 429 paused the provider while this call waited: reserve again after it

    def _late(self, what: str) -> BudgetRefused:
        return BudgetRefused(
            "deadline", f"judge {self.name}: the deadline passes before {what} allows the call"
        )


_PROVIDERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Provider]] = (
    weakref.WeakKeyDictionary()
)


def provider_for(name: str, budget: Budget) -> Provider:
    """The running loop's `Provider` for `name` (a judge's base URL), made on first use with
    `budget`; a later judge naming the same provider with other limits shares the first's
    (logged once)."""
    providers = _PROVIDERS.setdefault(asyncio.get_running_loop(), {})
    provider = providers.get(name)
    if provider is None:
        provider = providers[name] = Provider(name, budget)
    elif provider.budget != budget and not provider.warned:
        provider.warned = True
        log.warning(
            "judge %s: two judges name this provider with different limits; both use the"
            " first's (%s)",
            name,
            provider.budget,
        )
    return provider


def estimate_tokens(messages: Iterable[Mapping[str, Any]], completion_tokens: int) -> int:
    """Tokens a call may spend, before it is made: the prompt's characters / 4, 4 per message,
    plus `completion_tokens` (`max_tokens * n`).

    >>> estimate_tokens([{"role": "user", "content": "x" * 40}], 100)
    114
    """
    chars = 0
    count = 0
    for message in messages:
        count += 1
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):  # parts: count the text ones
            chars += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, Mapping))
    return chars // 4 + 4 * count + completion_tokens
