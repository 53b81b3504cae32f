"""Request bodies in, responses out: size limits, bounded gzip, JSON or msgpack.

Upstream decompressed request bodies without a limit (a gzip bomb took the server down,
W-API-12). Here the body is read in chunks up to `max_body` bytes as sent and inflated up to
`max_inflated` bytes; past either the request gets a 413 naming the limit.
"""

from __future__ import annotations

import gzip
import zlib

from starlette.requests import Request
from starlette.responses import Response

from atropos.wire import ProtocolError

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
GZIP_MIN_SIZE = 1000  # bytes; smaller responses are never compressed (as upstream)
GZIP_LEVEL = 1  # token ids compress well even at level 1, at a fraction of the CPU


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
            d = zlib.decompressobj(wbits=31)
            while data:
                piece = d.decompress(data, limit + 1 - total)
                total += len(piece)
                if total > limit:
                    raise ProtocolError(
                        f"gzip body inflates past the limit of {limit} bytes", status=413
                    )
                out.append(piece)
                data = d.unconsumed_tail
                if d.eof:
                    break
            if not d.eof:
                raise zlib.error("truncated")
            data = d.unused_data  # concatenated gzip members are allowed
    except zlib.error:
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


def respond(
    request: Request, payload: bytes, status: int = 200, media_type: str = "application/json"
) -> Response:
    """A response, gzipped when the client accepts it and the payload is over 1000 bytes."""
    headers = {}
    if len(payload) >= GZIP_MIN_SIZE and "gzip" in request.headers.get("accept-encoding", ""):
        payload = gzip.compress(payload, compresslevel=GZIP_LEVEL, mtime=0)
        headers["content-encoding"] = "gzip"
        headers["vary"] = "Accept-Encoding"
    return Response(payload, status_code=status, media_type=media_type, headers=headers)
