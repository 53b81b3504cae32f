"""The env's control calls to the trajectory API: register, info, status, disconnect.

One aiohttp session for the whole run (upstream opened a new one per status poll). `/status-env`
is sent as a GET with a JSON body, as upstream clients do, so our envs also work against
upstream's `run-api`. Its body also carries the env's cumulative drop and failure counts,
`{"env_id": N, "dropped": {"<reason>": n}, "failed": {"<kind>": n}}` (each left out when
empty), with its servers, latency stages and paced seconds, for the API's dashboard; upstream's
API ignores the extra fields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from atropos.envs.runner.stop import Stopper
from atropos.wire import REPORT_MAX_COUNT, REPORT_MAX_NAME_LENGTH, REPORT_MAX_NAMES

log = logging.getLogger("atropos.env")


class ApiError(RuntimeError):
    """The trajectory API answered with an error, or could not be reached."""


class ControlClient:
    """Registration and status calls for one env."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ControlClient:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; ApiError on a transport failure or a non-200 answer."""
        assert self._session is not None, "use ControlClient as an async context manager"
        try:
            async with self._session.request(method, self.url + path, json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ApiError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise ApiError(f"{method} {path}: {type(err).__name__}: {err}") from None

    async def register(
        self, request: dict[str, Any], deadline: float, stopper: Stopper | None = None
    ) -> dict[str, Any]:
        """Register, waiting for the trainer with a log line every 10 s that names the command
        to start (a trainer, or the API), up to `deadline` s.

        Raises ApiError at the deadline (naming what to check), `Stopped` when `stopper` is
        set meanwhile."""
        stopper = stopper or Stopper()
        start = time.monotonic()
        next_note = start
        while True:
            try:
                reply: dict[str, Any] = await stopper.race(
                    self.call("POST", "/register-env", request)
                )
                if reply.get("status") == "success":
                    return reply
                reason = "the API is up; no trainer has started"
                check = (
                    f"start a trainer, e.g. `atropos train --model tiny --api-url {self.url}`"
                    " (docs/trainer.md), which registers with the API"
                )
            except ApiError as err:
                reason = str(err)
                check = (
                    f"start the API (`atropos api serve`) at {self.url}, or set"
                    " --env.rollout_server_url"
                )
            waited = time.monotonic() - start
            if waited > deadline:
                raise ApiError(
                    f"gave up registering with {self.url} after {waited:.0f} s ({reason}):"
                    f" {check}; --env.register_timeout sets how long to wait"
                )
            if time.monotonic() >= next_note:
                log.warning(
                    "waiting to register with %s (%s): %s; %.0f s of %.0f s",
                    self.url,
                    reason,
                    check,
                    waited,
                    deadline,
                )
                next_note += 10
            await stopper.sleep(1.0)

    async def info(self) -> dict[str, Any]:
        reply: dict[str, Any] = await self.call("GET", "/info")
        return reply

    async def status(
        self,
        env_id: int,
        dropped: Mapping[str, int] | None = None,
        failed: Mapping[str, int] | None = None,
        servers: list[dict[str, Any]] | None = None,
        latency: dict[str, dict[str, Any]] | None = None,
        paced_seconds: float | None = None,
        outcomes: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """`/status-env`, sending the env's cumulative drop and failure counts (when any), its
        inference servers now (`ServerManager.server_report`, when it has any), its latency
        stages (`Latencies.summaries`), the seconds it was paced (when known) and its rollouts
        by outcome (`envs.outcome`, when any)."""
        body: dict[str, Any] = {"env_id": env_id}
        if dropped:
            body["dropped"] = _report_counts(dropped)
        if failed:
            body["failed"] = _report_counts(failed)
        if servers:
            body["servers"] = servers
        if latency:
            body["latency"] = latency
        if paced_seconds is not None:
            body["paced_seconds"] = paced_seconds
        if outcomes:
            body["outcomes"] = _report_counts(outcomes)
        reply: dict[str, Any] = await self.call("GET", "/status-env", body)
        return reply

    async def post_eval(
        self, env_id: int, version: int, metrics: Mapping[str, float], seconds: float, skipped: int
    ) -> None:
        """`POST /eval_results`: an evaluation of policy `version` (`--env.eval_every`)."""
        body = {
            "env_id": env_id,
            "policy_version": version,
            "metrics": dict(metrics),
            "seconds": seconds,
            "skipped": skipped,
        }
        await self.call("POST", "/eval_results", body)

    async def disconnect(self, env_id: int) -> None:
        await self.call("POST", "/disconnect-env", {"env_id": env_id})


def _report_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """`counts` within the API's rules for a report (`atropos.wire.REPORT_MAX_*`), which refuses
    the whole status poll otherwise: names cut to their longest, the smallest counts past the
    most names folded into "other".

    >>> [len(name) for name in _report_counts({"x" * 200: 1})]
    [100]
    >>> folded = _report_counts({f"r{i}": i for i in range(100)})
    >>> len(folded), folded["other"] == sum(range(37))
    (64, True)
    """
    out: dict[str, int] = {}
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    for i, (name, n) in enumerate(ranked):
        key = (name or "unnamed")[:REPORT_MAX_NAME_LENGTH]
        if i >= REPORT_MAX_NAMES - 1 and len(ranked) > REPORT_MAX_NAMES:
            key = "other"
        out[key] = min(out.get(key, 0) + int(n), REPORT_MAX_COUNT)
    return out
