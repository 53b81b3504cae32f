"""Request bodies in, responses out: size limits, bounded gzip, JSON or msgpack.

Upstream (atroposlib 0.4.0) decompressed request bodies without a limit (a gzip bomb took the
server down). Here the body is read in chunks up to `max_body` bytes as sent and inflated up to
`max_inflated` bytes; past either the request gets a 413 naming the limit.

Responses: upstream gzipped every response over 1000 bytes for any client that accepts gzip.
Compression at zlib's fastest level runs at about 80 MB/s on one core, slower than loopback and
slower than a datacenter network, so by default (`auto`) we compress only for clients that are
not on this machine; `always` and `never` are there for slow links and for measurements. Large
payloads compress in a worker thread (the compressor releases the GIL) so ingestion goes on.

Compression and inflation use ISA-L (`isal`, about 4x faster than zlib at compressing and 1.5x
at inflating, same formats) and fall back to the standard library where it is not installed.
"""

from __future__ import annotations

import ipaddress
import zlib
from typing import Any, Literal, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

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
        body = inflate(body, max_inflated)
    return body


def inflate(data: bytes, limit: int) -> bytes:
    """Gunzip `data`, refusing output larger than `limit` bytes.

    >>> import gzip
    >>> inflate(gzip.compress(b"hello"), 10)
    b'hello'
    >>> inflate(b"not gzip", 10)
    Traceback (most recent call last):
    ...
    atropos.wire.ProtocolError: Content-Encoding is gzip but the body is not valid gzip
    """
    out: list[bytes] = []
    total = 0
    try:
        while data:
            d: Any = _zlib.decompressobj(wbits=31)
            while data:
                piece = d.decompress(data, limit + 1 - total)
                total += len(piece)
                if total > limit:
                    raise ProtocolError(
                        f"gzip body inflates past the limit of {limit} bytes", status=413
                    )
                out.append(piece)
                if d.eof or (not piece and d.unconsumed_tail == data):
                    break  # done with this member, or no progress: truncated or not gzip
                data = d.unconsumed_tail
            if not d.eof:
                raise zlib.error("truncated or not gzip")
            data = d.unused_data  # concatenated gzip members are allowed
    except _INFLATE_ERRORS:
        raise ProtocolError(
            "Content-Encoding is gzip but the body is not valid gzip", status=400
        ) from None
    return b"".join(out)


def is_msgpack(request: Request) -> bool:
    """Whether the request body is msgpack rather than JSON."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return ctype in MSGPACK_TYPES


def wants_msgpack(request: Request) -> bool:
    """Whether the client asked for a msgpack response."""
    accept = request.headers.get("accept", "").lower()
    return any(t in accept for t in MSGPACK_TYPES)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def should_gzip(request: Request, size: int, policy: GzipPolicy) -> bool:
    """Whether to gzip a response of `size` bytes to this client under `policy`."""
    if size < GZIP_MIN_SIZE or policy == "never":
        return False
    if "gzip" not in request.headers.get("accept-encoding", ""):
        return False
    if policy == "always":
        return True
    return request.client is None or not _is_loopback(request.client.host)


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
