"""Bounded request heads for our uvicorn servers: at most `MAX_HEAD_BYTES` of request line and
headers, and at most `MAX_HEADERS` header fields, else 431 and the connection closes.

uvicorn's default parser (httptools, llhttp) has no such bound: it buffers a header of any size
(a 256 MiB header was accepted after 84 s, slowing every other client) and any number of them.
`h11` bounds the head but parses several times slower, and the API's throughput is benchmarked.
So this keeps httptools and counts the head twice: the URL and fields as the parser reports them
(exact, but only once a field is complete), and the bytes fed to the parser while a head stays
incomplete (which bounds what it buffers for a field still arriving; a read in which a head
begins is not counted, so this one holds to within one read, 256 KiB). The rest of a refused head
is never read.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads (see the module docstring).

    Once a head is refused, every parser callback is ignored for the rest of the read in hand
    (no request starts) and nothing more is read.
    """

    _head_open = True  # between the first byte of a request and the end of its headers
    _head_begun_in_chunk = False
    _head_bytes = 0  # bytes fed while the head was incomplete
    _field_bytes = 0  # URL and header fields reported so far
    _header_count = 0
    _refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._head_begun_in_chunk = False
        super().data_received(data)
        if self._refused or not self._head_open:
            return
        if not self._head_begun_in_chunk:
            self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(f"request line and headers exceed {MAX_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        if self._refused:
            return
        self._head_open = True
        self._head_begun_in_chunk = True
        self._head_bytes = 0
        self._field_bytes = 0
        self._header_count = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._field_bytes += len(url)
        if self._field_bytes > MAX_HEAD_BYTES:
            self._refuse(f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._header_count += 1
        self._field_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_count > MAX_HEADERS:
            self._refuse(f"more than {MAX_HEADERS} header fields")
        elif self._field_bytes > MAX_HEAD_BYTES:
            self._refuse(f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._head_open = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _refuse(self, why: str) -> None:
        """Answer 431 naming the limit and close without reading the rest."""
        self._refused = True
        message = f"{why}: send fewer or smaller headers"
        payload = json.dumps(
            {"error": {"type": "HeadersTooLarge", "message": message}, "detail": message}
        ).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + payload)
        self.transport.close()
