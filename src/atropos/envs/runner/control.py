"""The env's control calls to the trajectory API: register, info, status, disconnect.

One aiohttp session for the whole run (upstream opened a new one per status poll). `/status-env`
is sent as a GET with a JSON body, as upstream clients do, so our envs also work against
upstream's `run-api`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

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

    async def register(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Register, waiting for the trainer with a log line every 10 s, up to `deadline` s."""
        start = time.monotonic()
        next_note = start
        while True:
            try:
                reply: dict[str, Any] = await self.call("POST", "/register-env", request)
                if reply.get("status") == "success":
                    return reply
                reason = "the trainer has not started"
            except ApiError as err:
                reason = str(err)
            waited = time.monotonic() - start
            if waited > deadline:
                raise ApiError(f"gave up registering after {waited:.0f} s: {reason}")
            if time.monotonic() >= next_note:
                log.warning(
                    "waiting to register with %s (%s); %.0f s of %.0f s",
                    self.url,
                    reason,
                    waited,
                    deadline,
                )
                next_note += 10
            await asyncio.sleep(1.0)

    async def info(self) -> dict[str, Any]:
        reply: dict[str, Any] = await self.call("GET", "/info")
        return reply

    async def status(self, env_id: int) -> dict[str, Any]:
        reply: dict[str, Any] = await self.call("GET", "/status-env", {"env_id": env_id})
        return reply

    async def disconnect(self, env_id: int) -> None:
        await self.call("POST", "/disconnect-env", {"env_id": env_id})
