"""The trainer's side of the trajectory API: wait, register, lease batches, acknowledge.

Every call retries connection errors and 5xx answers until `patience` seconds have passed, so
a trainer rides out an API restart (the API is durable: its queue and leases come back). Leased
batches are acknowledged by the trainer only once a checkpoint covers them, so a trainer that
dies between checkpoints gets the same batches again when it registers anew (no data lost, none
trained twice into the weights it resumes from).

Bodies go through `atropos.wire`: the registration is a `wire.Registration`, the answer of
`GET /batch` decodes as a `wire.BatchAnswer` (its groups as `wire.Group`, in one pass).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from atropos import wire

log = logging.getLogger("atropos.trainer")
T = TypeVar("T")
_JSON = {"Content-Type": "application/json"}


class ApiError(RuntimeError):
    """The API refused a request or stayed unreachable past the deadline."""


@dataclass
class Batch:
    """One leased batch: its groups, the API step it makes, and the id to acknowledge."""

    groups: list[wire.Group]
    step: int
    batch_id: str | None


class TrainerClient:
    """A small synchronous client (the trainer is one thread doing one thing at a time)."""

    def __init__(
        self, url: str, api_key: str | None = None, patience: float = 120.0, timeout: float = 30.0
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self.patience = patience
        self.takes_versions = True  # False once the API answered 404 to /policy_version

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> bytes:
        """The answer's body; `body` (a `wire` struct) is sent as JSON."""
        if body is not None:
            kwargs.update(content=wire.encode(body), headers=_JSON)
        deadline = time.monotonic() + self.patience
        delay = 0.2
        while True:
            try:
                r = self.http.request(method, path, **kwargs)
                if r.status_code < 500:
                    if r.status_code >= 400:
                        raise ApiError(f"{method} {path}: {r.status_code} {r.text[:300]}")
                    return r.content
                problem = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                raise ApiError(
                    f"{method} {path}: still failing after {self.patience:.0f} s: {problem}"
                )
            log.warning("API %s %s: %s; retrying in %.1f s", method, path, problem, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    @staticmethod
    def _decode(what: str, raw: bytes, kind: type[T]) -> T:
        try:
            answer: T = wire.decode(raw, kind)
        except wire.ProtocolError as err:
            raise ApiError(f"{what}: the answer breaks the protocol: {err}") from None
        return answer

    def wait_ready(self) -> None:
        """Until `GET /health` answers (the API may still be starting)."""
        self._call("GET", "/health")

    def register(self, **fields: Any) -> int:
        """`POST /register` (upstream's fields); returns the uuid."""
        answer = self._call("POST", "/register", wire.Registration(**fields))
        return int(self._decode("POST /register", answer, wire.Registered).uuid)

    def next_batch(
        self, lease: float, poll: float = 0.05, stop: Any = None, within: float | None = None
    ) -> Batch | None:
        """Lease the next batch, polling while none is ready; None once `stop()` is true, or
        when none came `within` seconds (None: keep polling)."""
        wait = poll
        deadline = None if within is None else time.monotonic() + within
        while stop is None or not stop():
            raw = self._call("GET", "/batch", params={"lease": lease})
            answer = self._decode("GET /batch", raw, wire.BatchAnswer)
            if answer.status == "error":
                raise ApiError(f"GET /batch: {answer.message or raw.decode(errors='replace')}")
            if answer.batch is not None:
                return Batch(answer.batch, answer.step, answer.batch_id)
            if deadline is not None and time.monotonic() + wait > deadline:
                return None
            time.sleep(wait)
            wait = min(wait * 1.5, 1.0)
        return None

    def published(self, version: int) -> None:
        """`POST /policy_version`: the inference servers now serve the weights of `version`
        (said after every completed sync, so environments stamp groups with the version that
        generated them, not with the step of the last batch handed out). An API without the
        route (atroposlib's `run-api`) answers 404: said once in the log, then not asked again,
        and its environments stamp groups with its step as before."""
        if not self.takes_versions:
            return
        try:
            self._call("POST", "/policy_version", wire.PolicyPublished(version))
        except ApiError as err:
            if " 404 " not in str(err):
                raise
            self.takes_versions = False
            log.warning(
                "the API has no POST /policy_version (an atroposlib API?): groups will be"
                " stamped with its step, which runs ahead of the weights during a sync"
            )

    def ack(self, batch_id: str, missing_ok: bool = False) -> None:
        """`POST /batch/ack`. An id already acknowledged (a retried call) is not an error.

        `missing_ok`: an id the API no longer knows (acknowledged long ago) is not one either.
        """
        try:
            self._call("POST", "/batch/ack", wire.BatchAck(batch_id))
        except ApiError as err:
            if not (missing_ok and " 404 " in str(err)):
                raise
