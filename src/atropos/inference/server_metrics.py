"""Time to first token and the servers' own queue time, read from their Prometheus histograms.

`ServerManager` returns whole answers (token-exact turns need them), so nothing on the env side
sees a first token. vLLM and SGLang time it themselves: vLLM serves
`vllm:time_to_first_token_seconds` and `vllm:request_queue_time_seconds`, SGLang (with
`--enable-metrics`) `sglang:time_to_first_token_seconds` and `sglang:queue_time_seconds`, as
Prometheus histograms on `GET /metrics` (names checked against vLLM 0.32.0,
`vllm/v1/metrics/loggers.py`, and SGLang's "Production Metrics" page). `ServerMetrics` (one per
`ServerManager`) reads each vllm/sglang server's `/metrics` at the env's status polls (at most
every `INTERVAL` seconds, in a task of its own: a server that hangs never holds up the status
poll), takes the buckets' growth since its last read and notes it into the
env's `ttft` and `server_queue` stages (`atropos.inference.latency`: the same sliding window as
the other stages, merged over the env's servers) and into each server's own, which
`ServerManager.server_report` sends for the dashboard's servers panel (`ttft_p50`, `_p95`,
`_p99`).

Choices where the issue is silent:

* **Buckets as samples.** A bucket's new observations are spread evenly over it (its upper
  edge included), which is the linear interpolation Prometheus' `histogram_quantile` does; the
  `+Inf` bucket counts at the last finite edge. When every new observation of a read fell in
  one bucket, they count at their mean (the growth of `_sum` over that of `_count`) instead:
  exact for a narrow spread, and it keeps a fast server's queue time (vLLM's first queue-time
  bucket is 0 to 0.3 s) from reading as 0.15 s.
* **What it covers.** A server's histograms count every request it served, from every client:
  envs sharing a server see the same figures, evaluation calls included.
* **Cadence and failures.** The first read of a server is the baseline (nothing noted). A read
  has a deadline (`DEADLINE`); a failed one is logged once (until one succeeds again) and
  retried at the next poll, never fatal. A server that answers without either histogram (a
  404, or no such metric: an OpenAI endpoint, TRL, our local server) is logged once and not
  read again: its stages stay empty. Counts that fell (the server restarted) or buckets that
  changed start a new baseline. Other server types are never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from atropos.inference.base import server_root
from atropos.inference.concurrency import Histogram, parse_histograms
from atropos.inference.config import APIServerConfig
from atropos.inference.http import HTTPClient
from atropos.inference.latency import QUANTILES, Latencies, Latency

log = logging.getLogger(__name__)

HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "server_queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
}
"""The env's stage each server histogram fills (the first name a server serves)."""
NAMES = tuple(name for names in HISTOGRAMS.values() for name in names)
SERVER_TYPES = frozenset({"vllm", "sglang"})
"""Server types whose `/metrics` is read."""
INTERVAL = 1.0
"""Seconds: the least time between two reads of the servers."""
DEADLINE = 2.0
"""Seconds a read of one server may take."""
SPREAD = 8
"""The most points a bucket's new observations are spread over."""


def growth(before: Histogram, after: Histogram) -> list[tuple[float, float, int]] | None:
    """`(low, high, n)`: the new observations of each bucket between two reads (`high` is inf
    for the last bucket); None when the buckets changed or a count fell (a restart).

    >>> a = Histogram([(0.1, 1.0), (0.5, 1.0), (float("inf"), 1.0)], 0.05, 1.0)
    >>> b = Histogram([(0.1, 1.0), (0.5, 4.0), (float("inf"), 5.0)], 1.55, 5.0)
    >>> growth(a, b)
    [(0.1, 0.5, 3), (0.5, inf, 1)]
    """
    if [e for e, _ in before.buckets] != [e for e, _ in after.buckets]:
        return None
    out = []
    low, last_old, last_new = 0.0, 0.0, 0.0
    for (edge, old), (_, new) in zip(before.buckets, after.buckets, strict=True):
        n = round((new - last_new) - (old - last_old))
        if new < old:
            return None
        if n > 0:
            out.append((low, edge, n))
        low, last_old, last_new = edge, old, new
    return out


def note_growth(
    stages: Sequence[Latency], grown: list[tuple[float, float, int]], mean: float
) -> None:
    """Note the new observations into `stages` (this module's docstring: buckets as samples)."""
    if len(grown) == 1:
        low, high, n = grown[0]
        at = min(max(mean, low), high) if mean >= 0 else high
        for stage in stages:
            stage.add(at, n)
        return
    for low, high, n in grown:
        if high == float("inf"):
            high = low
        points = min(n, SPREAD)
        for k in range(points):
            share = n // points + (1 if k < n % points else 0)
            at = low + (high - low) * (k + 1) / points
            for stage in stages:
                stage.add(at, share)


class ServerHistograms:
    """One server's last read histograms and its own `ttft` and `server_queue` stages."""

    def __init__(self, config: APIServerConfig, window: float) -> None:
        self.url = config.base_url
        self.metrics_url = server_root(config.base_url) + "/metrics"
        key = config.api_key.get_secret_value()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.read = config.server_type in SERVER_TYPES
        self.failing = False
        self.last: dict[str, Histogram] = {}
        self.stages = {stage: Latency(window) for stage in HISTOGRAMS}

    def take(self, text: str, into: Latencies | None) -> bool:
        """Note what grew since the last read; False when the text has none of the histograms."""
        found = parse_histograms(text, NAMES)
        if not found:
            return False
        for stage, names in HISTOGRAMS.items():
            name = next((n for n in names if n in found), None)
            if name is None:
                continue
            now, before = found[name], self.last.get(name)
            self.last[name] = now
            grown = growth(before, now) if before is not None else None
            if grown:
                count = now.count - before.count if before is not None else 0.0
                mean = (now.sum - before.sum) / count if before is not None and count > 0 else -1
                targets = [self.stages[stage]]
                if into is not None:
                    targets.append(into.stages[stage])
                note_growth(targets, grown, mean)
        return True

    def row(self) -> dict[str, float]:
        """`ttft_p50`, `ttft_p95`, `ttft_p99` over the window (left out when empty)."""
        summary = self.stages["ttft"].summary()
        return {f"ttft_{q}": summary[q] for q, _ in QUANTILES if summary[q] is not None}


class ServerMetrics:
    """The histograms of a `ServerManager`'s servers (this module's docstring)."""

    def __init__(self, configs: Sequence[APIServerConfig], window: float = 60.0) -> None:
        self.servers = [ServerHistograms(c, window) for c in configs]
        self.due = 0.0
        self.polling: asyncio.Task[None] | None = None  # `poll_soon`'s read, while it runs

    def poll_soon(self, into: Latencies | None) -> None:
        """`poll` in a task of its own when one is due and none runs, so that a server that
        hangs holds its own read (up to `DEADLINE`), never the caller (the env's status
        poll); a failure is logged, never raised. `aclose` ends a read still running."""
        if time.monotonic() < self.due or (self.polling is not None and not self.polling.done()):
            return
        self.polling = asyncio.ensure_future(self._poll_logged(into))

    async def _poll_logged(self, into: Latencies | None) -> None:
        try:
            await self.poll(into)
        except Exception:  # never fatal: the next due poll reads again
            log.exception("reading the inference servers' histograms failed")

    async def aclose(self) -> None:
        """End a `poll_soon` read still running (its connections closed with it)."""
        polling, self.polling = self.polling, None
        if polling is not None and not polling.done():
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling

    async def poll(self, into: Latencies | None, now: float | None = None) -> None:
        """Read every server that has the histograms, when `INTERVAL` has passed since the last
        poll, and note what grew into `into` (the env's stages) and each server's own."""
        now = time.monotonic() if now is None else now
        readable = [s for s in self.servers if s.read]
        if now < self.due or not readable:
            return
        self.due = now + INTERVAL
        client = HTTPClient()
        try:
            await asyncio.gather(*(self._read(client, s, into) for s in readable))
        finally:
            await client.close()

    async def _read(
        self, client: HTTPClient, server: ServerHistograms, into: Latencies | None
    ) -> None:
        try:
            answer = await client.request(
                "GET", server.metrics_url, headers=server.headers, timeout=DEADLINE
            )
        except (OSError, TimeoutError, ValueError) as err:
            if not server.failing:
                log.warning("reading %s failed (will retry): %r", server.metrics_url, err)
            server.failing = True
            return
        if server.failing:
            log.info("reading %s works again", server.metrics_url)
        server.failing = False
        text = answer.body.decode("utf-8", "replace") if answer.status == 200 else ""
        if not server.take(text, into):
            log.info(
                "%s serves no time-to-first-token or queue-time histogram at %s (HTTP %d):"
                " its ttft and server_queue stay empty",
                server.url,
                server.metrics_url,
                answer.status,
            )
            server.read = False

    def row(self, index: int) -> dict[str, float]:
        """Server `index`'s TTFT quantiles for its `server_report` row."""
        return self.servers[index].row()


def scrape_servers(env: Any, into: Latencies) -> None:
    """Read the servers of `env`'s `ServerManager` in the background when due
    (`ServerMetrics.poll_soon`; none yet, or another kind: nothing)."""
    metrics = getattr(getattr(env, "_server", None), "server_metrics", None)
    if isinstance(metrics, ServerMetrics):
        metrics.poll_soon(into)
