"""Request bodies in, responses out: size limits, bounded gzip, JSON or msgpack.

Upstream (atroposlib 0.4.0) decompressed request bodies without a limit (a gzip bomb took the
server down). Here the body is read in chunks up to `max_body` bytes as sent and inflated up to
`max_inflated` bytes; past either the request gets a 413 naming the limit. Inflation stops as
soon as the output passes the limit (a bomb costs at most the limit in memory, not its inflated
size) and runs in a worker thread, at most `INFLATE_SLOTS` at a time per app, so bombs delay
no one else: `/health` answers in milliseconds while five arrive at once. The first MiB of
output is inflated on the event loop (about a millisecond), so the usual body never pays for a
thread (a thread per body cost 40% more server CPU in `benchmarks/api_throughput.py`).

Responses: upstream gzipped every response over 1000 bytes for any client that accepts gzip.
Compression at zlib's fastest level runs at about 80 MB/s on one core, slower than loopback and
slower than a datacenter network, so by default (`auto`) we compress only for clients that are
not on this machine; `always` and `never` are there for slow links and for measurements. Large
payloads compress in a worker thread (the compressor releases the GIL) so ingestion goes on.

Compression and inflation use ISA-L (`isal`, about 4x faster than zlib at compressing and 1.5x
at inflating, same formats) and fall back to the standard library where it is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from atropos.names import is_loopback
from atropos.wire import ProtocolError

try:
    from isal import igzip as _gzip
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal has wheels for every platform we build on
    import gzip as _gzip  # type: ignore[no-redef]
    import zlib as _zlib  # type: ignore[no-redef]

_INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, cast(type, _zlib.error))

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
GZIP_MIN_SIZE = 1000  # bytes; smaller responses are never compressed (as upstream)
GZIP_LEVEL = 1  # token ids compress well even at level 1, at a fraction of the CPU
THREAD_MIN_SIZE = 256 * 1024  # compress payloads at least this large off the event loop
INLINE_INFLATE_MAX = 1 << 20  # the first MiB of a gzip body inflates on the event loop
INFLATE_SLOTS = 2  # gzip bodies inflating at once (CPU-bound; each holds up to the limit)
INFLATE_WAIT = 30.0  # seconds a gzip body waits for a slot before its request gets 503
_FEED = 64 * 1024  # input given to the decompressor at a time (its unconsumed tail is copied)
_PIECE = 1 << 20  # output taken from the decompressor at a time
_SLOT_POLL = 0.02  # seconds between looks for a free inflation slot
GzipPolicy = Literal["auto", "always", "never"]


async def read_body(request: Request, max_body: int, max_inflated: int) -> bytes:
    """Read the whole body, enforcing both limits and undoing `Content-Encoding: gzip`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise ProtocolError(
            f"body of {declared} bytes exceeds the limit of {max_body} bytes", status=413
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise ProtocolError(f"body exceeds the limit of {max_body} bytes", status=413)
        chunks.append(chunk)
    body = b"".join(chunks)
    if "gzip" in request.headers.get("content-encoding", "").lower():
        inflater = Inflater(body, max_inflated)
        if inflater.run(INLINE_INFLATE_MAX):  # small bodies: a thread would cost more
            return inflater.result()
        async with _inflation_slot(request):
            return await run_in_threadpool(inflater.finish)
    return body


@contextlib.asynccontextmanager
async def _inflation_slot(request: Request) -> AsyncIterator[None]:
    """One of the app's `INFLATE_SLOTS`, or a 503 after `INFLATE_WAIT` seconds without one."""
    state = request.app.state
    slots: asyncio.Semaphore | None = getattr(state, "inflation_slots", None)
    if slots is None:  # one per app, made on its event loop
        slots = state.inflation_slots = asyncio.Semaphore(INFLATE_SLOTS)
    # Polled rather than `wait_for(acquire())`, which on Python < 3.12 can lose a slot won
    # just as the deadline passes; between `locked()` and `acquire()` nothing else runs.
    deadline = asyncio.get_running_loop().time() + INFLATE_WAIT
    while slots.locked():
        if asyncio.get_running_loop().time() > deadline:
            raise ProtocolError(
                f"waited {INFLATE_WAIT:g} s for one of the {INFLATE_SLOTS} gzip inflation slots,"
                " all busy with other requests: retry later",
                status=503,
            )
        await asyncio.sleep(_SLOT_POLL)
    await slots.acquire()  # free: returns at once
    try:
        yield
    finally:
        slots.release()


class Inflater:
    """The gunzip of one body, refusing output past `limit` bytes, that can stop and go on:
    `read_body` inflates the first megabyte on the event loop and the rest in a worker thread.

    The input is fed in pieces of `_FEED` bytes and the output taken in pieces of at most
    `_PIECE` bytes, so the running size is checked every megabyte and a bomb is refused as
    soon as it passes `limit`: memory never holds more than `limit` plus one piece. The output
    grows in one buffer, which the allocator maps on its own once large and so gives back to
    the system when a bomb is refused (a list of 1 MiB pieces stayed in the heap: 500 MiB of
    RSS kept after a few bombs).
    """

    def __init__(self, data: bytes, limit: int) -> None:
        self.limit = limit
        self.total = 0  # bytes out so far
        self._out = bytearray()
        self._pending = memoryview(data)  # input not yet given to the decompressor
        self._tail: bytes | memoryview = b""  # input given to it but not yet consumed
        self._d: Any = _zlib.decompressobj(wbits=31)
        self._full = False  # the last call stopped at its output bound: call again

    def run(self, upto: int | None = None) -> bool:
        """Inflate to the end (True) or until `upto` bytes are out (False); ProtocolError 413
        past the limit, 400 when the body is not gzip."""
        stop = self.limit + 1 if upto is None else upto
        try:
            while self._tail or self._pending or self._full:
                if self.total >= stop:
                    return False
                if not self._tail and not self._full:
                    self._tail, self._pending = self._pending[:_FEED], self._pending[_FEED:]
                bound = min(_PIECE, self.limit + 1 - self.total)
                piece = self._d.decompress(self._tail, bound)
                self.total += len(piece)
                if self.total > self.limit:
                    self._out = bytearray()
                    raise ProtocolError(
                        f"gzip body inflates past the limit of {self.limit} bytes", status=413
                    )
                self._out += piece
                self._full = len(piece) == bound and not self._d.eof
                if self._d.eof:  # end of a member; concatenated members are allowed
                    self._tail = self._d.unused_data
                    if not self._tail and not self._pending:
                        return True
                    self._d = _zlib.decompressobj(wbits=31)
                else:
                    self._tail = self._d.unconsumed_tail
            raise zlib.error("truncated")
        except _INFLATE_ERRORS:
            self._out = bytearray()
            raise ProtocolError(
                "Content-Encoding is gzip but the body is not valid gzip", status=400
            ) from None

    def result(self) -> bytes:
        """The inflated body, once `run` returned True (taken: a second call gives b"")."""
        out, self._out = self._out, bytearray()
        return bytes(out)

    def finish(self) -> bytes:
        """Inflate the rest and return the body (in a worker thread: the join is big too)."""
        self.run()
        return self.result()


def inflate(data: bytes, limit: int) -> bytes:
    """Gunzip `data`, refusing output larger than `limit` bytes (see `Inflater`).

    >>> import gzip
    >>> inflate(gzip.compress(b"hello"), 10)
    b'hello'
    >>> inflate(b"not gzip", 10)
    Traceback (most recent call last):
    ...
    atropos.wire.ProtocolError: Content-Encoding is gzip but the body is not valid gzip
    """
    return Inflater(data, limit).finish()


def is_msgpack(request: Request) -> bool:
    """Whether the request body is msgpack rather than JSON."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return ctype in MSGPACK_TYPES


def wants_msgpack(request: Request) -> bool:
    """Whether the client asked for a msgpack response."""
    accept = request.headers.get("accept", "").lower()
    return any(t in accept for t in MSGPACK_TYPES)


def should_gzip(request: Request, size: int, policy: GzipPolicy) -> bool:
    """Whether to gzip a response of `size` bytes to this client under `policy`."""
    if size < GZIP_MIN_SIZE or policy == "never":
        return False
    if "gzip" not in request.headers.get("accept-encoding", ""):
        return False
    if policy == "always":
        return True
    return request.client is None or not is_loopback(request.client.host)


async def respond(
    request: Request, payload: bytes, status: int = 200, media_type: str = "application/json"
) -> Response:
    """A response, gzipped when `should_gzip` says so under the app's policy."""
    headers = {}
    policy: GzipPolicy = getattr(request.app.state, "response_gzip", "auto")
    if should_gzip(request, len(payload), policy):
        if len(payload) >= THREAD_MIN_SIZE:
            payload = await run_in_threadpool(_gzip.compress, payload, GZIP_LEVEL, mtime=0)
        else:
            payload = _gzip.compress(payload, GZIP_LEVEL, mtime=0)
        headers["content-encoding"] = "gzip"
        headers["vary"] = "Accept-Encoding"
    return Response(payload, status_code=status, media_type=media_type, headers=headers)
