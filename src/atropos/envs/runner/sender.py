"""Getting groups to the trajectory API without losing one.

`Sender` batches groups (up to `max_batch` per request, or whatever is ready after `linger`
seconds), gzips bodies over 1 KB unless the API is on this machine (`compress`: on loopback,
gzip and gunzip cost CPU on both ends and save nothing), and POSTs them to `/scored_data_list`
as JSON, or as msgpack (`application/msgpack`) once an answer carried our API's
`Atropos-Contract` header (`msgpack`: auto; upstream's API reads JSON only, so the first batch
is always JSON). msgpack costs the env about half the CPU of JSON per group, the API about 30%
less to read, and is a third smaller (logprobs are 9 bytes, not their decimal text); a batch
msgpack cannot encode (an integer over 64 bits) goes as JSON
(with the lean keep-alive client of `atropos.inference.http`), with up to `max_in_flight`
requests at once (so a busy event loop, where every request takes several loop turns, never
makes the sender the bottleneck and its queue grow). A failed send is retried
a bounded number of times with jittered backoff, but only for errors that can succeed later
(connection failures, timeouts, 5xx, 429); every retry carries the same `group_id`s, so the API
stores each group once. When the retries run out, or the API cannot be reached at all, the
groups go to a spool file on disk; a background task replays the spool, oldest first, once the
API answers again. `close()` flushes what is queued and leaves the rest in the spool, so a
restart of the env picks it up.

Once bodies are msgpack, `submit` encodes each group at once (`Packed`), while the objects it
was just built from are still in the CPU's caches, and the batch body is those encodings put
together: at 256 workers on a busy machine, encoding 24 groups at the pump, long after they
were built, cost ~23 us per group, against ~5 us right at `submit`. The group's objects are
then freed by its maker, also while warm, not by the pump. The spool, a JSON batch and the
replay decode a packed group back into its dict (only on those rare paths).

Upstream (atroposlib 0.4.0) made three attempts over about 20 s and then dropped the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from atropos import wire
from atropos.inference.http import HTTPClient
from atropos.names import is_loopback_url

try:
    from isal import igzip as _gzip  # ISA-L: the same gzip format, several times faster
except ImportError:  # pragma: no cover - isal is a dependency with wheels for our platforms
    import gzip as _gzip  # type: ignore[no-redef]

log = logging.getLogger("atropos.sender")

_timeout_at = getattr(asyncio, "timeout_at", None)  # Python 3.11+

GZIP_MIN = 1024  # bytes; smaller bodies are sent as they are (as upstream's BaseEnv does)


_JSON = {"Content-Type": "application/json"}
_GZIPPED_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
_MSGPACK = {"Content-Type": "application/msgpack"}
_GZIPPED_MSGPACK = {"Content-Type": "application/msgpack", "Content-Encoding": "gzip"}
_OURS = wire.CONTRACT_HEADER.lower()  # in every answer of our API (response header names)
_msgpack_encode = msgspec.msgpack.Encoder().encode


class Packed:
    """A group encoded as msgpack when submitted (`msgspec.Raw`: put into a batch's body as it
    is), and its `policy_version` (what `Sender.on_done` reports)."""

    __slots__ = ("raw", "policy_version")

    def __init__(self, raw: msgspec.Raw, policy_version: Any) -> None:
        self.raw = raw
        self.policy_version = policy_version

    def group(self) -> dict[str, Any]:
        """The group as a dict again (for the spool and JSON bodies)."""
        group: dict[str, Any] = msgspec.msgpack.decode(self.raw)
        return group


Queued = dict[str, Any] | Packed
"""A group waiting for the sender: as submitted, or already encoded (`Packed`)."""


def plain(items: Sequence[Queued]) -> list[dict[str, Any]]:
    """`items` as group dicts (packed ones decoded)."""
    return [i.group() if isinstance(i, Packed) else i for i in items]


def versions(items: Sequence[Queued]) -> list[Any]:
    """The `policy_version` of each of `items` (None where it has none)."""
    return [i.policy_version if isinstance(i, Packed) else i.get("policy_version") for i in items]


class SendError(Exception):
    """A send failed; `retryable` says whether trying again can help."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class SenderStats:
    """What the sender did (for metrics)."""

    sent: int = 0  # groups the API acknowledged
    duplicates: int = 0  # groups the API already had (a retry that had landed)
    rejected: int = 0  # groups the API refused with a 4xx (bad data: dropped and logged)
    spooled: int = 0  # groups written to the spool
    replayed: int = 0  # groups sent from the spool
    attempts: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Spool:
    """An append-only JSONL file of groups waiting for the API, consumed by rewriting it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, groups: list[dict[str, Any]]) -> None:
        with open(self.path, "ab") as f:
            for g in groups:
                f.write(wire.encode_plain(g) + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        groups = []
        for line in self.path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):  # a torn last line from a crash mid-write
                groups.append(json.loads(line))
        return groups

    def replace(self, groups: list[dict[str, Any]]) -> None:
        """Atomically leave only `groups` in the spool."""
        if not groups:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for g in groups:
                f.write(wire.encode_plain(g) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self.read())


class Sender:
    """Batches, sends, retries, spools and replays groups for one env."""

    def __init__(
        self,
        url: str,
        spool_path: Path,
        *,
        api_key: str | None = None,
        max_batch: int = 32,
        max_in_flight: int = 4,
        linger: float = 0.05,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 30.0,
        replay_every: float = 2.0,
        compress: bool | None = None,
        msgpack: bool | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.spool = Spool(spool_path)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_batch = max_batch
        self.max_in_flight = max(1, max_in_flight)
        self.linger = linger
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.replay_every = replay_every
        # gzip costs both ends CPU to save bandwidth that loopback does not need (None: auto)
        self.compress = not is_loopback_url(self.url) if compress is None else compress
        # msgpack bodies: None until an answer says whether the API is ours (then True)
        self.msgpack = msgpack
        self.stats = SenderStats()
        self._queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._whole = asyncio.Event()  # the lingering batch can fill (`_fill` ends early)
        self._lacks = 1  # groups the lingering batch lacks (`_fill` sets it)
        self._filling: dict[int, list[Queued]] = {}  # batches taking groups, by id
        self._session: HTTPClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._spool_lock = asyncio.Lock()
        self.in_flight = 0  # groups in requests that have not been answered yet
        # called with the policy versions of each batch's groups (None where a group has
        # none) once the batch is done with: acknowledged, spooled or refused (staleness
        # pacing counts a group as in flight until then: groups overtake each other)
        self.on_done: Callable[[list[Any]], None] | None = None

    async def start(self) -> None:
        self._session = HTTPClient(self.headers)
        pumps = [asyncio.create_task(self._pump()) for _ in range(self.max_in_flight)]
        self._tasks = [*pumps, asyncio.create_task(self._replay())]

    def submit(self, group: dict[str, Any]) -> None:
        """Queue a group for sending (returns at once); encoded now when bodies are msgpack
        (`Packed`), so the caller may change or drop `group` afterwards."""
        if self.msgpack:
            try:
                packed = Packed(msgspec.Raw(_msgpack_encode(group)), group.get("policy_version"))
            except (TypeError, OverflowError, msgspec.EncodeError):
                pass  # a value msgpack cannot hold: queued as it is, its batch goes as JSON
            else:
                self._queued(packed)
                return
        self._queued(group)

    def _queued(self, item: Queued) -> None:
        queue = self._queue
        queue.put_nowait(item)
        if queue.qsize() >= self._lacks:
            self._whole.set()

    @property
    def pending(self) -> int:
        """Groups submitted and not yet in a request: queued, or in a batch still filling
        (pacing counts every group not yet at the API)."""
        return self._queue.qsize() + sum(map(len, self._filling.values()))  # no generator

    async def _fill(self, batch: list[Queued]) -> None:
        """Wait for a group, then take up to `max_batch`: whatever is queued at once (no loop
        turn per group), then what arrives within `linger` seconds. Fills `batch` in place, so
        a cancelled caller still knows which groups it took."""
        queue = self._queue
        batch.append(await queue.get())
        self._take_queued(batch)
        if len(batch) >= self.max_batch or self.linger <= 0:
            return
        loop = asyncio.get_running_loop()
        if _timeout_at is None:  # pragma: no cover - Python 3.10: a timer per wait
            deadline = loop.time() + self.linger
            while len(batch) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
                self._take_queued(batch)
            return
        # the linger: one timer, and a wake once the queue holds what the batch lacks, not one
        # per group (a `queue.get()` per group resumed this task for nearly every group
        # submitted). With several pumps lingering, the last to wait sets what wakes them all;
        # one woken early takes what is there and waits again, one woken late ends at the timer.
        whole = self._whole
        with contextlib.suppress(TimeoutError):
            async with _timeout_at(loop.time() + self.linger):
                while len(batch) < self.max_batch:
                    self._lacks = self.max_batch - len(batch)
                    if queue.qsize() < self._lacks:
                        whole.clear()
                        await whole.wait()
                    self._take_queued(batch)
        self._take_queued(batch)  # what came during the linger

    def _take_queued(self, batch: list[Queued]) -> None:
        queue = self._queue
        while len(batch) < self.max_batch and not queue.empty():
            batch.append(queue.get_nowait())

    async def _pump(self) -> None:
        """One of `max_in_flight` loops: take a batch, deliver it, repeat."""
        while True:
            batch: list[Queued] = []
            try:
                self._filling[id(batch)] = batch
                try:
                    await self._fill(batch)
                finally:
                    del self._filling[id(batch)]
                self.in_flight += len(batch)
                try:
                    await self._deliver(batch)
                finally:
                    self.in_flight -= len(batch)
            except asyncio.CancelledError:
                # stopped while batching or sending: keep the groups taken (a copy that did
                # land is deduplicated by group_id)
                if batch:
                    self.spool.append(plain(batch))
                    self.stats.spooled += len(batch)
                raise
            finally:
                for _ in batch:
                    self._queue.task_done()
                if self.on_done is not None and batch:
                    self.on_done(versions(batch))

    async def _deliver(self, batch: list[Queued]) -> None:
        try:
            await self._send_with_retries(batch)
        except SendError as err:
            if err.retryable:
                log.warning("API unreachable (%s): spooling %d groups", err, len(batch))
                async with self._spool_lock:
                    self.spool.append(plain(batch))
                self.stats.spooled += len(batch)
            else:
                self.stats.rejected += len(batch)
                log.error("API refused %d groups, dropped: %s", len(batch), err)

    async def _send_with_retries(self, batch: Sequence[Queued]) -> None:
        for attempt in range(self.retries + 1):
            try:
                await self._post(batch)
                return
            except SendError as err:
                kind = "retryable" if err.retryable else "rejected"
                self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
                if not err.retryable or attempt == self.retries:
                    raise
                delay = self.backoff * 2**attempt * (0.5 + random.random())
                await asyncio.sleep(delay)

    async def _post(self, batch: Sequence[Queued]) -> None:
        assert self._session is not None, "Sender.start() was not awaited"
        body, packed = self._encode(batch)
        headers = _MSGPACK if packed else _JSON
        if self.compress and len(body) >= GZIP_MIN:
            body = _gzip.compress(body, compresslevel=1)
            headers = _GZIPPED_MSGPACK if packed else _GZIPPED_JSON
        self.stats.attempts += 1
        try:
            answer = await self._session.request(
                "POST", f"{self.url}/scored_data_list", body, headers, timeout=self.timeout
            )
        except (asyncio.TimeoutError, OSError) as err:
            raise SendError(f"{type(err).__name__}: {err}", retryable=True) from None
        if self.msgpack is None and answer.headers.get(_OURS):
            self.msgpack = True  # our API: msgpack from the next batch on
        text = answer.body.decode("utf-8", "replace")
        if answer.status == 200:
            try:
                reply = msgspec.json.decode(answer.body) if answer.body else {}
            except msgspec.DecodeError:
                reply = {}
            dups = int(reply.get("duplicates", 0)) if isinstance(reply, dict) else 0
            self.stats.duplicates += dups
            self.stats.sent += len(batch) - dups
            return
        retryable = answer.status >= 500 or answer.status in (408, 429)
        raise SendError(f"HTTP {answer.status}: {text[:300]}", retryable)

    def _encode(self, batch: Sequence[Queued]) -> tuple[bytes, bool]:
        """The body of `batch` and whether it is msgpack (else JSON, `wire.encode_plain`);
        a packed group goes in as it was encoded."""
        if self.msgpack:
            try:
                return _msgpack_encode([i.raw if type(i) is Packed else i for i in batch]), True
            except (TypeError, OverflowError, msgspec.EncodeError):
                pass  # a value msgpack cannot hold: JSON, which takes anything
        return wire.encode_plain(plain(batch)), False

    async def _replay(self) -> None:
        while True:
            await asyncio.sleep(self.replay_every)
            await self.replay_once()

    async def replay_once(self) -> int:
        """Try to send what is spooled, oldest first; return how many groups went out."""
        async with self._spool_lock:
            waiting = self.spool.read()
            sent = 0
            while waiting:
                chunk = waiting[: self.max_batch]
                try:
                    await self._post(chunk)
                except SendError as err:
                    if err.retryable:
                        break  # still down: try again later
                    self.stats.rejected += len(chunk)
                    log.error("API refused %d spooled groups, dropped: %s", len(chunk), err)
                else:
                    sent += len(chunk)
                waiting = waiting[len(chunk) :]
                self.spool.replace(waiting)
            self.stats.replayed += sent
            return sent

    async def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued was sent or spooled, at most `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush, stop the background tasks, spool anything left, close the session."""
        if self._tasks:
            await self.flush(timeout)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        leftover: list[Queued] = []
        while self._queue.qsize():
            leftover.append(self._queue.get_nowait())
            self._queue.task_done()
        if leftover:
            self.spool.append(plain(leftover))
            self.stats.spooled += len(leftover)
        if self._session is not None:
            await self._session.close()
            self._session = None
