"""Streaming latency percentiles: one log-bucketed histogram, and the stages an env records.

`Latency` keeps a fixed array of buckets on a log scale (`PER_OCTAVE` buckets per doubling,
from `FLOOR` seconds up, `BUCKETS` of them): recording is one `log2`, one clamp and three
additions (a fraction of a microsecond: benchmarks/RESULTS.md, "Latency recording"), memory is
fixed, and a quantile is read back as the geometric middle of its bucket, within 4.4% of the
true value (half a bucket: 2 ** (1 / 16)), clamped to the largest value seen.

Quantiles cover a sliding window: the buckets are swapped out every `window` seconds, when a
summary is read, and a summary merges the current and the previous buckets, so it covers the
last `window` to 2 x `window` seconds (what changes shows within a minute or two at the
default). `count` and `sum` count since the process started (Prometheus' summary semantics).

`Latencies` holds an env's stages (`STAGES`). The runner binds one to its context
(`with latencies.bind():`); tasks started inside copy the context, so the inference layer
(`ServerManager._call`: queue wait and server time) and the scoring code note into the env's
stages through `note`, without being handed anything; with none bound, `note` does nothing.

Choices where the issue is silent:

* Only training calls are noted by the inference layer; an evaluation's calls have their own
  budget (the eval split) and would mix another workload into the figures.
* `ServerManager`'s calls return whole answers (token-exact turns need the full answer), so
  `server` is the whole time of a call and `ttft` comes from the servers' own Prometheus
  histograms (`atropos.inference.server_metrics`, with `server_queue`); a streaming caller
  may note it too.

>>> lat = Latency()
>>> for ms in range(1, 101):
...     lat.record(ms / 1000)
>>> s = lat.summary(now=0.0)
>>> s["count"], round(s["sum"], 3), abs(s["p50"] - 0.050) < 0.05 * 0.050, s["max"]
(100, 5.05, True, 0.1)
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PER_OCTAVE = 8
"""Buckets per doubling: a bucket spans a factor 2 ** (1/8) (9%)."""
FLOOR = 1e-5
"""Seconds: everything below falls in the first bucket."""
BUCKETS = 36 * PER_OCTAVE
"""36 doublings above `FLOOR`: up to 6.9e5 s (8 days); anything longer falls in the last."""
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
STAGES = ("rollout", "ttft", "server", "queue_wait", "scoring", "server_queue")
"""What an env records: a whole rollout (its group, from start to scored), the time to the
first token (read from the servers' own histograms, `server_metrics`, or noted by a call that
streams), the server's time for a call, the wait for a concurrency slot in the `ServerManager`
before a call, the time spent scoring a group, and the time requests waited in the servers' own
queues (their histograms)."""

_SCALE = PER_OCTAVE / math.log(2)
_LOG_FLOOR = math.log(FLOOR)
_LAST = BUCKETS - 1


class Latency:
    """One stage's latencies: a log-bucketed histogram over a sliding window, and the count
    and sum since the start."""

    __slots__ = ("buckets", "previous", "count", "sum", "max", "window", "swapped")

    def __init__(self, window: float = 60.0) -> None:
        self.buckets = [0] * BUCKETS
        self.previous = [0] * BUCKETS
        self.count = 0
        self.sum = 0.0
        self.max = 0.0  # the largest value in the window
        self.window = window
        self.swapped = time.monotonic()

    def record(self, seconds: float) -> None:
        """Note one duration (seconds; a negative one counts as 0)."""
        if seconds > FLOOR:
            i = int((math.log(seconds) - _LOG_FLOOR) * _SCALE)
            self.buckets[i if i < _LAST else _LAST] += 1
            if seconds > self.max:
                self.max = seconds
        else:
            self.buckets[0] += 1
        self.count += 1
        self.sum += seconds if seconds > 0 else 0.0

    def add(self, seconds: float, n: int) -> None:
        """Note `n` durations of `seconds` each (a server's histogram, read as samples)."""
        i = int((math.log(seconds) - _LOG_FLOOR) * _SCALE) if seconds > FLOOR else 0
        self.buckets[min(i, _LAST)] += n
        self.max = max(self.max, seconds)
        self.count += n
        self.sum += seconds * n if seconds > 0 else 0.0

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """`{"count", "sum", "p50", "p95", "p99", "max"}`: quantiles over the window (None
        when nothing was noted in it); swaps the window when it is `window` seconds old."""
        merged = [a + b for a, b in zip(self.buckets, self.previous, strict=True)]
        out: dict[str, Any] = {"count": self.count, "sum": self.sum}
        out.update(quantiles(merged, self.max))
        out["max"] = self.max if sum(merged) else None
        now = time.monotonic() if now is None else now
        if now - self.swapped >= self.window:
            self.previous, self.buckets = self.buckets, [0] * BUCKETS
            self.swapped = now
            self.max = _top(self.previous)
        return out


def quantiles(buckets: list[int], top: float) -> dict[str, float | None]:
    """p50, p95 and p99 of `buckets`: each the geometric middle of the bucket its rank falls
    in, at most `top` (the largest value seen).

    >>> b = [0] * BUCKETS
    >>> b[100] = 1
    >>> round(quantiles(b, 10.0)["p50"] / middle(100), 6)
    1.0
    """
    total = sum(buckets)
    if not total:
        return {name: None for name, _ in QUANTILES}
    out: dict[str, float | None] = {}
    ranks = [(name, max(1, math.ceil(q * total))) for name, q in QUANTILES]
    seen = 0
    k = 0
    for i, n in enumerate(buckets):
        seen += n
        while k < len(ranks) and seen >= ranks[k][1]:
            out[ranks[k][0]] = min(middle(i), top) if top > 0 else middle(i)
            k += 1
        if k == len(ranks):
            break
    return out


def middle(i: int) -> float:
    """The geometric middle of bucket `i` (seconds)."""
    return FLOOR * 2 ** ((i + 0.5) / PER_OCTAVE)


def _top(buckets: list[int]) -> float:
    """The upper edge of the highest bucket in use (0.0 when none): the window's max after a
    swap, when the exact value has gone with the older buckets."""
    for i in range(BUCKETS - 1, -1, -1):
        if buckets[i]:
            return FLOOR * 2 ** ((i + 1) / PER_OCTAVE)
    return 0.0


class Latencies:
    """An env's latency stages (`STAGES`), and how long its admission was paced."""

    def __init__(self, window: float = 60.0) -> None:
        self.stages = {name: Latency(window) for name in STAGES}

    def record(self, stage: str, seconds: float) -> None:
        self.stages[stage].record(seconds)

    def summaries(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """The summary of every stage that noted anything (`Latency.summary`)."""
        return {name: lat.summary(now) for name, lat in self.stages.items() if lat.count}

    def metrics(self) -> dict[str, float]:
        """The summaries as the env's metrics record takes them: `latency/<stage>_{p50, p95,
        p99}` (seconds, over the window; left out when empty) and `latency/<stage>_count`.

        >>> stages = Latencies()
        >>> stages.record("scoring", 0.5)
        >>> sorted(stages.metrics())[:2]
        ['latency/scoring_count', 'latency/scoring_p50']
        """
        out: dict[str, float] = {}
        for name, s in self.summaries().items():
            out[f"latency/{name}_count"] = float(s["count"])
            for q, _ in QUANTILES:
                if s[q] is not None:
                    out[f"latency/{name}_{q}"] = s[q]
        return out

    @contextmanager
    def bind(self) -> Iterator[Latencies]:
        """Make these the stages `note` records into, in this context and tasks started in it."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


_CURRENT: contextvars.ContextVar[Latencies | None] = contextvars.ContextVar(
    "atropos_latencies", default=None
)


def note(stage: str, seconds: float) -> None:
    """Record `seconds` in `stage` of the bound `Latencies` (nothing when none is bound)."""
    stages = _CURRENT.get()
    if stages is not None:
        stages.stages[stage].record(seconds)


def note_call(split: str, waited: float, served: float) -> None:
    """One answered inference call: its wait for a slot and the server's time (training calls
    only; see the module docstring)."""
    stages = _CURRENT.get()
    if stages is not None and split == "train":
        stages.stages["queue_wait"].record(waited)
        stages.stages["server"].record(served)
