"""The trainer's side of the trajectory API: wait, register, lease batches, acknowledge, say
which policy the servers serve; and, through a `Publisher`, the weights into those servers.

Every call retries connection errors and 5xx answers until `patience` seconds have passed, so
a trainer rides out an API restart (the API is durable: its queue and leases come back). A
leased batch (`next_batch(lease=S)`) is served again to the next trainer that asks after `S`
seconds unless acknowledged (`ack`); `atropos train` acknowledges only once a checkpoint covers
it, so a trainer that dies between checkpoints gets the same batches again when it registers
anew (no data lost, none trained twice into the weights it resumes from).

Bodies go through `atropos.wire`: the registration is a `wire.Registration`, the answer of
`GET /batch` decodes as a `wire.BatchAnswer` (its groups as `wire.Group`, in one pass).
`TrainerClient` is synchronous, `AsyncTrainerClient` the same calls for asyncio. Where
`atropos launch` runs the trainer, both find the API, the servers and their keys in the
environment it sets (`ATROPOS_API_URL`, `ATROPOS_SERVER_URLS`, `ATROPOS_TRAIN_API_KEY`,
`ATROPOS_TRAIN_SERVER_API_KEY`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from atropos import wire
from atropos.client.publish import Publisher
from atropos.client.samples import Sample, samples_from_groups

if TYPE_CHECKING:
    from atropos.client.tensors import Layout, MicroBatch

log = logging.getLogger("atropos.client")
T = TypeVar("T")
_JSON = {"Content-Type": "application/json"}
DEFAULT_API = "http://127.0.0.1:8000"


class ApiError(RuntimeError):
    """The API refused a request or stayed unreachable past the deadline."""


@dataclass
class Batch:
    """One leased batch: its groups, the API step it makes, and the id to acknowledge."""

    groups: list[wire.Group]
    step: int
    batch_id: str | None

    @property
    def has_teacher(self) -> bool:
        """Whether every group carries teacher logprobs (`distill_*` fields)."""
        return bool(self.groups) and all(
            g.distill_token_ids is not None and g.distill_logprobs is not None for g in self.groups
        )

    def samples(self, max_len: int | None = None, teacher: bool = False) -> list[Sample]:
        """One `Sample` per sequence, its advantages worked out (`samples.samples_from_groups`)."""
        return samples_from_groups(self.groups, max_len, teacher=teacher)

    def tensors(
        self,
        layout: Layout = "padded",
        pad_id: int = 0,
        max_len: int | None = None,
        teacher: bool | None = None,
    ) -> MicroBatch:
        """The whole batch as torch tensors (`tensors.collate` or `tensors.pack`; the
        alignment is in `atropos.client.tensors`). `teacher`: keep teacher logprobs (None:
        when every group has them)."""
        from atropos.client.tensors import to_tensors

        with_teacher = self.has_teacher if teacher is None else teacher
        return to_tensors(self.samples(max_len, with_teacher), layout, pad_id)


def _api_key(api_key: str | None) -> str | None:
    return api_key or os.environ.get("ATROPOS_TRAIN_API_KEY") or None


def _failure(method: str, path: str, r: httpx.Response) -> str | None:
    """None for a 2xx; raises `ApiError` on a 4xx; the problem of a 5xx (retried)."""
    if r.status_code < 400:
        return None
    if r.status_code < 500:
        raise ApiError(f"{method} {path}: {r.status_code} {r.text[:300]}")
    return f"{r.status_code} {r.text[:200]}"


def _decode(what: str, raw: bytes, kind: type[T]) -> T:
    try:
        answer: T = wire.decode(raw, kind)
    except wire.ProtocolError as err:
        raise ApiError(f"{what}: the answer breaks the protocol: {err}") from None
    return answer


def _batch(raw: bytes) -> Batch | None:
    answer = _decode("GET /batch", raw, wire.BatchAnswer)
    if answer.status == "error":
        raise ApiError(f"GET /batch: {answer.message or raw.decode(errors='replace')}")
    if answer.batch is None:
        return None
    return Batch(answer.batch, answer.step, answer.batch_id)


_NO_VERSIONS = (
    "the API has no POST /policy_version (an atroposlib API?): groups will be"
    " stamped with its step, which runs ahead of the weights during a sync"
)


class _Base:
    """What both clients hold: the API's address, the patience, the servers' `Publisher`."""

    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        patience: float,
        publisher: Publisher | None,
        publish_options: dict[str, Any],
    ) -> None:
        self.url = (url or os.environ.get("ATROPOS_API_URL") or DEFAULT_API).rstrip("/")
        key = _api_key(api_key)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.patience = patience
        self.takes_versions = True  # False once the API answered 404 to /policy_version
        self._publisher = publisher
        self._publish_options = publish_options

    @property
    def publisher(self) -> Publisher:
        """The inference servers' `Publisher`, made on first use from the options given
        (`servers`, `sync`, ...) and the environment (`ATROPOS_SERVER_URLS`)."""
        if self._publisher is None:
            options = dict(self._publish_options)
            self._publisher = Publisher(options.pop("sync", "reload"), **options)
        return self._publisher

    def _retry(self, method: str, path: str, problem: str, deadline: float, delay: float) -> float:
        if time.monotonic() > deadline:
            raise ApiError(f"{method} {path}: still failing after {self.patience:.0f} s: {problem}")
        log.warning("API %s %s: %s; retrying in %.1f s", method, path, problem, delay)
        return min(delay * 2, 5.0)

    def _no_versions(self, err: ApiError) -> None:
        if " 404 " not in str(err):
            raise err
        self.takes_versions = False
        log.warning(_NO_VERSIONS)


class TrainerClient(_Base):
    """The synchronous client (a trainer is one thread doing one thing at a time).

    Args:
        url: the API; default `$ATROPOS_API_URL`, else http://127.0.0.1:8000.
        api_key: its key; default `$ATROPOS_TRAIN_API_KEY`.
        patience: seconds to keep retrying an unreachable API (or a 5xx).
        timeout: seconds for one HTTP call.
        publisher: the servers' `Publisher`; else one is made on first `publish`/`paused`
            from `publish_options` (`sync="reload"`, `servers=...`, `out_dir=...`, ...).
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        patience: float = 120.0,
        timeout: float = 30.0,
        *,
        publisher: Publisher | None = None,
        **publish_options: Any,
    ) -> None:
        super().__init__(url, api_key, patience, publisher, publish_options)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def close(self) -> None:
        """Close the connections (and the publisher's: a restart-mode server is stopped)."""
        self.http.close()
        if self._publisher is not None:
            self._publisher.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> bytes:
        """The answer's body; `body` (a `wire` struct) is sent as JSON."""
        if body is not None:
            kwargs.update(content=wire.encode(body), headers=_JSON)
        deadline = time.monotonic() + self.patience
        delay = 0.2
        while True:
            try:
                r = self.http.request(method, path, **kwargs)
                problem = _failure(method, path, r)
                if problem is None:
                    return r.content
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
            wait = delay
            delay = self._retry(method, path, problem, deadline, delay)
            time.sleep(wait)

    def wait_ready(self) -> None:
        """Until `GET /health` answers (the API may still be starting)."""
        self._call("GET", "/health")

    def register(self, **fields: Any) -> int:
        """`POST /register` with `wire.Registration`'s fields; returns the uuid."""
        answer = self._call("POST", "/register", wire.Registration(**fields))
        return int(_decode("POST /register", answer, wire.Registered).uuid)

    def next_batch(
        self,
        lease: float | None = None,
        poll: float = 0.05,
        stop: Callable[[], bool] | None = None,
        within: float | None = None,
    ) -> Batch | None:
        """The next batch, polling while none is ready; None once `stop()` is true, or when
        none came `within` seconds (None: keep polling). `lease`: seconds the API holds it for
        this trainer until `ack` (None: a plain `GET /batch`, acknowledged as it is served)."""
        wait = poll
        deadline = None if within is None else time.monotonic() + within
        params = {} if lease is None else {"lease": lease}
        while stop is None or not stop():
            batch = _batch(self._call("GET", "/batch", params=params))
            if batch is not None:
                return batch
            if deadline is not None and time.monotonic() + wait > deadline:
                return None
            time.sleep(wait)
            wait = min(wait * 1.5, 1.0)
        return None

    def ack(self, batch_id: str, missing_ok: bool = False) -> None:
        """`POST /batch/ack`. An id already acknowledged (a retried call) is not an error;
        `missing_ok`: an id the API no longer knows (acknowledged long ago) is not one either."""
        try:
            self._call("POST", "/batch/ack", wire.BatchAck(batch_id))
        except ApiError as err:
            if not (missing_ok and " 404 " in str(err)):
                raise

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
            self._no_versions(err)

    def publish(self, model_or_dir: Any, version: int, tokenizer: Any = None) -> int:
        """The weights (a model, or a directory holding them) into the inference servers
        (`Publisher.sync`), then `published`; returns the version the servers serve."""
        publisher = self.publisher
        publisher.sync(model_or_dir, version, tokenizer=tokenizer)
        served = version if publisher.served_version is None else publisher.served_version
        self.published(served)
        return served

    def paused(self, timeout: float = 300.0) -> contextlib.AbstractContextManager[None]:
        """Generation paused and drained on the servers for a `with` block
        (`Publisher.paused`)."""
        return self.publisher.paused(timeout)


class AsyncTrainerClient(_Base):
    """`TrainerClient`'s calls for asyncio (the same arguments; `paused` is `async with`)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        patience: float = 120.0,
        timeout: float = 30.0,
        *,
        publisher: Publisher | None = None,
        **publish_options: Any,
    ) -> None:
        super().__init__(url, api_key, patience, publisher, publish_options)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    async def close(self) -> None:
        await self.http.aclose()
        if self._publisher is not None:
            await asyncio.to_thread(self._publisher.close)

    async def __aenter__(self) -> AsyncTrainerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> bytes:
        if body is not None:
            kwargs.update(content=wire.encode(body), headers=_JSON)
        deadline = time.monotonic() + self.patience
        delay = 0.2
        while True:
            try:
                r = await self.http.request(method, path, **kwargs)
                problem = _failure(method, path, r)
                if problem is None:
                    return r.content
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
            wait = delay
            delay = self._retry(method, path, problem, deadline, delay)
            await asyncio.sleep(wait)

    async def wait_ready(self) -> None:
        await self._call("GET", "/health")

    async def register(self, **fields: Any) -> int:
        answer = await self._call("POST", "/register", wire.Registration(**fields))
        return int(_decode("POST /register", answer, wire.Registered).uuid)

    async def next_batch(
        self, lease: float | None = None, poll: float = 0.05, within: float | None = None
    ) -> Batch | None:
        """The next batch, polling while none is ready (cancel the task to stop); None when
        none came `within` seconds."""
        wait = poll
        deadline = None if within is None else time.monotonic() + within
        params = {} if lease is None else {"lease": lease}
        while True:
            batch = _batch(await self._call("GET", "/batch", params=params))
            if batch is not None:
                return batch
            if deadline is not None and time.monotonic() + wait > deadline:
                return None
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, 1.0)

    async def ack(self, batch_id: str, missing_ok: bool = False) -> None:
        try:
            await self._call("POST", "/batch/ack", wire.BatchAck(batch_id))
        except ApiError as err:
            if not (missing_ok and " 404 " in str(err)):
                raise

    async def published(self, version: int) -> None:
        if not self.takes_versions:
            return
        try:
            await self._call("POST", "/policy_version", wire.PolicyPublished(version))
        except ApiError as err:
            self._no_versions(err)

    async def publish(self, model_or_dir: Any, version: int, tokenizer: Any = None) -> int:
        """`TrainerClient.publish`, the sync in a worker thread."""
        publisher = self.publisher
        await asyncio.to_thread(publisher.sync, model_or_dir, version, tokenizer=tokenizer)
        served = version if publisher.served_version is None else publisher.served_version
        await self.published(served)
        return served

    @contextlib.asynccontextmanager
    async def paused(self, timeout: float = 300.0) -> AsyncIterator[None]:
        """`TrainerClient.paused` for `async with` (the HTTP calls in a worker thread)."""
        held = self.publisher.paused(timeout)
        await asyncio.to_thread(held.__enter__)
        try:
            yield
        except BaseException as err:
            if not await asyncio.to_thread(held.__exit__, type(err), err, err.__traceback__):
                raise
        else:
            await asyncio.to_thread(held.__exit__, None, None, None)


__all__ = ["ApiError", "AsyncTrainerClient", "Batch", "TrainerClient"]
