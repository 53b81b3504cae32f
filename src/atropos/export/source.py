"""Where groups come from: JSONL files of `atropos env process`, or a live API's `/rollouts`.

Both sources yield `Item`s: a checked `Group` and where it came from (`file:line`, or the API's
arrival number), or the reason the input could not be used. A bad line never ends a read.

The API source is a read-only follower: it pages through `GET /rollouts?after=SEQ`, which
leases, consumes and resets nothing, so the trainer's batches and the queue are exactly as they
would have been without the export (atroposlib 0.4.0's exporters called `/reset_data` and posed
as the trainer).

>>> import io
>>> lines = io.BytesIO(b'{"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1]}\\n\\n{bad\\n')
>>> for item in read_lines(lines, "run.jsonl"):
...     print(item.where, item.problem or item.group.scores)
run.jsonl:1 [1.0]
run.jsonl:3 invalid JSON: JSON is malformed: object keys must be strings (byte 1)
"""

from __future__ import annotations

import contextlib
import gzip
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import httpx
import msgspec

MASKED = -100  # the mask value of an untrained position (the trainer's ignore index)


class Group(msgspec.Struct):
    """The fields of a scored group that an export reads (other fields are ignored)."""

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    messages: list[Any] | None = None
    env_id: int | None = None


@dataclass(frozen=True)
class Item:
    """One group read, or why the input at `where` is not one (`group` is then None)."""

    where: str
    group: Group | None = None
    problem: str | None = None


class SourceError(Exception):
    """A source that cannot go on at all (an API that refuses us, a missing file)."""


def check(group: Group) -> str | None:
    """What breaks the rules for groups (docs/api.md), or None for a usable group.

    >>> check(Group(tokens=[[1, 2]], masks=[[-100]], scores=[0.5]))
    'masks[0]: 1 entries for 2 tokens'
    >>> check(Group(tokens=[[1], [2]], masks=[[1], [2]], scores=[1.0]))
    'scores: 1 entries for 2 sequences'
    """
    n = len(group.tokens)
    if n == 0:
        return "tokens: an empty group"
    for name in ("masks", "scores"):
        if len(getattr(group, name)) != n:
            return f"{name}: {len(getattr(group, name))} entries for {n} sequences"
    for i, (row, mask) in enumerate(zip(group.tokens, group.masks, strict=True)):
        if not row:
            return f"tokens[{i}]: an empty sequence"
        if len(mask) != len(row):
            return f"masks[{i}]: {len(mask)} entries for {len(row)} tokens"
    for i, score in enumerate(group.scores):
        if not math.isfinite(score):
            return f"scores[{i}]: {score} is not a finite number"
    return None


def decode_group(raw: bytes | str, where: str) -> Item:
    """One JSON group (a line, or a group from `/rollouts`) as a checked `Item`."""
    try:
        group = msgspec.json.decode(raw, type=Group)
    except msgspec.ValidationError as err:
        return Item(where, problem=f"not a group: {err}")
    except msgspec.DecodeError as err:
        return Item(where, problem=f"invalid JSON: {err}")
    problem = check(group)
    return Item(where, problem=problem) if problem else Item(where, group)


def read_lines(lines: Iterable[bytes], name: str) -> Iterator[Item]:
    """Groups from JSONL lines (blank lines skipped), each `Item.where` being `name:LINE`."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield decode_group(line, f"{name}:{number}")


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer  # left open: it is not ours
    elif path.endswith(".gz"):
        with gzip.open(path, "rb") as z:
            yield cast(IO[bytes], z)
    else:
        with open(path, "rb") as f:
            yield f


class FileSource:
    """Groups from JSONL files (`-` is stdin, `*.gz` is read through gzip), in order.

    `done_bytes` and `total_bytes` follow the reading, for a progress bar.
    """

    def __init__(self, paths: list[str]) -> None:
        for path in paths:
            if path != "-" and not Path(path).is_file():
                raise SourceError(f"{path}: no such file")
        self.paths = paths
        self.total_bytes = sum(Path(p).stat().st_size for p in paths if p != "-")
        self.done_bytes = 0
        self.notes: dict[str, int] = {}

    def describe(self) -> str:
        return ", ".join(self.paths)

    def __iter__(self) -> Iterator[Item]:
        for path in self.paths:
            with _open(path) as f:
                yield from read_lines(self._counted(f, path), path)

    def _counted(self, f: IO[bytes], path: str) -> Iterator[bytes]:
        plain = path != "-" and not path.endswith(".gz")
        for line in f:
            if plain:
                self.done_bytes += len(line)
            yield line
        if path != "-" and not plain:
            self.done_bytes += Path(path).stat().st_size


class _Rollout(msgspec.Struct):
    seq: int
    group: msgspec.Raw
    env_id: int | None = None


class _Page(msgspec.Struct):
    rollouts: list[_Rollout]
    newest: int | None = None
    missed: int = 0


class ApiSource:
    """Groups from a live API's `/rollouts`, followed until `timeout` seconds have passed.

    Reading starts at the oldest group the API still holds (or, with `since_now`, at the next
    one to arrive). `notes` counts what the reader noticed: `missed` (groups that left the
    API's window before they were read), `api_restarts` (the numbering went back) and
    `connection_errors` (retried until the deadline).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        since_now: bool = False,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.url, headers=headers, timeout=30.0, transport=transport
        )
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.since_now = since_now
        self.clock = clock
        self.sleep = sleep
        self.notes: dict[str, int] = {"missed": 0, "api_restarts": 0, "connection_errors": 0}

    def describe(self) -> str:
        return self.url

    def close(self) -> None:
        self.client.close()

    def __iter__(self) -> Iterator[Item]:
        deadline = None if self.timeout is None else self.clock() + self.timeout
        after = -1
        if self.since_now:
            page = self._page(-1, 1, deadline)
            after = -1 if page is None or page.newest is None else page.newest
        while deadline is None or self.clock() < deadline:
            page = self._page(after, 1000, deadline)
            if page is None:  # the deadline passed while the API was unreachable
                return
            if page.newest is not None and after > page.newest:
                self.notes["api_restarts"] += 1  # a fresh numbering: read it from the start
                after = -1
                continue
            self.notes["missed"] += page.missed
            for r in page.rollouts:
                after = r.seq
                yield decode_group(bytes(r.group), f"{self.url} seq {r.seq}")
            if not page.rollouts:
                self._wait(deadline)

    def _wait(self, deadline: float | None) -> None:
        pause = self.poll_interval
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - self.clock()))
        if pause > 0:
            self.sleep(pause)

    def _page(self, after: int, limit: int, deadline: float | None) -> _Page | None:
        """One page of `/rollouts`; connection errors are retried until the deadline."""
        while True:
            try:
                reply = self.client.get("/rollouts", params={"after": after, "limit": limit})
            except httpx.TransportError as err:
                self.notes["connection_errors"] += 1
                if self.notes["connection_errors"] == 1:
                    print(f"cannot reach {self.url} ({err}); retrying", file=sys.stderr)
                if deadline is not None and self.clock() >= deadline:
                    return None
                self._wait(deadline)
                continue
            break
        if reply.status_code == 401:
            raise SourceError(
                f"{self.url} wants an API key: pass --api-key KEY or set ATROPOS_API_KEY"
            )
        if reply.status_code == 404:
            raise SourceError(
                f"{self.url} has no /rollouts endpoint (an older API): the export reads only"
                " through /rollouts, which consumes nothing; update the API, or export from"
                " the JSONL files of `atropos env process` with --input"
            )
        if reply.status_code != 200:
            raise SourceError(f"{self.url}/rollouts answered {reply.status_code}: {reply.text}")
        try:
            return msgspec.json.decode(reply.content, type=_Page)
        except msgspec.DecodeError as err:
            raise SourceError(f"{self.url}/rollouts: unexpected answer ({err})") from None
