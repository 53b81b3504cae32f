"""The backends' lean HTTP/1.1 client against a raw socket server we script byte by byte."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from atropos.inference.http import HTTPClient, HTTPProtocolError
from atropos.testing import free_port


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


# answer(connection_no, request_no_on_that_connection, request_bytes) -> bytes to send, or None
# to close the connection without answering
Script = Callable[[int, int, bytes], bytes | None]


@contextmanager
def raw_server(script: Script) -> Iterator[tuple[str, dict[str, int]]]:
    """A threaded TCP server answering each whole request (head + Content-Length body)."""
    stats = {"connections": 0, "requests": 0}
    listener = socket.create_server(("127.0.0.1", free_port()))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket, number: int) -> None:
        buf, seen = b"", 0
        with conn:
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\r\n\r\n" in buf:
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(rest) < length:
                        break
                    request, buf = head + b"\r\n\r\n" + rest[:length], rest[length:]
                    seen += 1
                    stats["requests"] += 1
                    answer = script(number, seen, request)
                    if answer is None:
                        return  # close without answering
                    conn.sendall(answer)
                    if b"Connection: close" in answer:
                        return

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            stats["connections"] += 1
            threading.Thread(target=serve, args=(conn, stats["connections"]), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", stats
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def run(coro):
    return asyncio.run(coro)


def test_requests_reuse_one_keep_alive_connection_and_send_the_headers():
    seen: list[bytes] = []

    def script(conn: int, n: int, request: bytes) -> bytes:
        seen.append(request)
        return ok(b'{"n":%d}' % n)

    with raw_server(script) as (url, stats):

        async def main() -> list:
            client = HTTPClient({"Authorization": "Bearer k"})
            answers = [
                await client.request("POST", url + "/v1/x?a=1", b'{"q":1}', {"X-A": "b"})
                for _ in range(5)
            ]
            await client.close()
            return answers

        answers = run(main())
    assert [a.status for a in answers] == [200] * 5
    assert [a.body for a in answers] == [b'{"n":%d}' % i for i in range(1, 6)]
    assert answers[0].headers["content-type"] == "application/json"
    assert stats["connections"] == 1
    first = seen[0].decode()
    assert first.startswith("POST /v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert "X-A: b\r\n" in first and "Authorization: Bearer k\r\n" in first
    assert "Content-Length: 7\r\n" in first and first.endswith('\r\n\r\n{"q":1}')


def test_a_reused_connection_the_server_dropped_is_retried_once_on_a_new_one():
    def script(conn: int, n: int, request: bytes) -> bytes | None:
        return None if n == 2 else ok()  # the 2nd request on a connection: closed, no answer

    with raw_server(script) as (url, stats):

        async def main() -> list[int]:
            client = HTTPClient()
            statuses = [(await client.request("GET", url + "/a")).status for _ in range(3)]
            await client.close()
            return statuses

        assert run(main()) == [200, 200, 200]
    # each connection serves one request, then drops the next: every drop is retried once
    assert stats["connections"] == 3 and stats["requests"] == 5


def test_a_fresh_connection_closed_without_an_answer_is_an_error():
    with raw_server(lambda conn, n, request: None) as (url, _):

        async def main() -> None:
            client = HTTPClient()
            try:
                await client.request("GET", url + "/a")
            finally:
                await client.close()

        with pytest.raises(ConnectionError):
            run(main())


def test_chunked_and_read_until_close_bodies():
    chunked = (
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
    )
    until_close = b'HTTP/1.1 201 Created\r\nConnection: close\r\n\r\n{"b":2}'

    def script(conn: int, n: int, request: bytes) -> bytes:
        return chunked if b"/chunked" in request else until_close

    with raw_server(script) as (url, stats):

        async def main() -> list:
            client = HTTPClient()
            got = [
                await client.request("GET", url + "/chunked"),
                await client.request("GET", url + "/chunked"),
                await client.request("GET", url + "/close"),
                await client.request("GET", url + "/chunked"),
            ]
            await client.close()
            return got

        got = run(main())
    assert [(a.status, a.body) for a in got] == [
        (200, b'{"a":1}'),
        (200, b'{"a":1}'),
        (201, b'{"b":2}'),
        (200, b'{"a":1}'),
    ]
    assert stats["connections"] == 2  # the close-delimited answer ended its connection


def test_a_timeout_raises_and_the_connection_is_not_reused():
    def script(conn: int, n: int, request: bytes) -> bytes:
        if b"/slow" in request:
            threading.Event().wait(0.5)
        return ok()

    with raw_server(script) as (url, stats):

        async def main() -> int:
            client = HTTPClient()
            with pytest.raises(TimeoutError):
                await client.request("GET", url + "/slow", timeout=0.1)
            answer = await client.request("GET", url + "/fast", timeout=5)
            await client.close()
            return answer.status

        assert run(main()) == 200
    assert stats["connections"] == 2


def test_a_cancelled_request_leaves_no_reusable_connection():
    def script(conn: int, n: int, request: bytes) -> bytes:
        if b"/slow" in request:
            threading.Event().wait(0.3)
        return ok()

    with raw_server(script) as (url, stats):

        async def main() -> int:
            client = HTTPClient()
            task = asyncio.ensure_future(client.request("GET", url + "/slow"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            answer = await client.request("GET", url + "/fast")
            await client.close()
            return answer.status

        assert run(main()) == 200
    assert stats["connections"] == 2


def test_refused_garbage_and_closed():
    async def refused() -> None:
        client = HTTPClient()
        try:
            await client.request("GET", f"http://127.0.0.1:{free_port()}/x", timeout=5)
        finally:
            await client.close()

    with pytest.raises(ConnectionRefusedError):
        run(refused())

    with raw_server(lambda conn, n, request: b"NOT HTTP AT ALL\r\n\r\n") as (url, _):

        async def garbage() -> None:
            client = HTTPClient()
            try:
                await client.request("GET", url + "/x", timeout=5)
            finally:
                await client.close()

        with pytest.raises(HTTPProtocolError):
            run(garbage())

    async def closed() -> None:
        client = HTTPClient()
        await client.close()
        assert client.closed
        await client.request("GET", "http://127.0.0.1:1/x")

    with pytest.raises(RuntimeError, match="closed"):
        run(closed())
    with pytest.raises(ValueError, match="http"):
        run(HTTPClient().request("GET", "ftp://host/x"))


def test_idle_connections_older_than_the_idle_timeout_are_not_reused():
    with raw_server(lambda conn, n, request: ok()) as (url, stats):

        async def main() -> None:
            client = HTTPClient(idle_timeout=0.05)
            await client.request("GET", url + "/a")
            await asyncio.sleep(0.1)
            await client.request("GET", url + "/a")
            await client.request("GET", url + "/a")
            await client.close()

        run(main())
    assert stats["connections"] == 2


def test_many_concurrent_requests_open_as_many_connections_as_needed():
    def script(conn: int, n: int, request: bytes) -> bytes:
        threading.Event().wait(0.05)
        return ok(request.split(b"\r\n\r\n", 1)[1])

    with raw_server(script) as (url, stats):

        async def main() -> list[bytes]:
            client = HTTPClient()
            answers = await asyncio.gather(
                *(client.request("POST", url + "/e", b"%d" % i) for i in range(20))
            )
            await client.close()
            return [a.body for a in answers]

        assert run(main()) == [b"%d" % i for i in range(20)]
    assert stats["connections"] == 20


def test_a_client_used_from_a_new_event_loop_opens_new_connections():
    with raw_server(lambda conn, n, request: ok()) as (url, stats):
        client = HTTPClient()
        assert run(client.request("GET", url + "/a")).status == 200
        assert run(client.request("GET", url + "/a")).status == 200  # another asyncio.run
        run(client.close())
    assert stats["connections"] == 2


def test_an_answer_nobody_asked_for_retires_the_connection():
    def script(conn: int, n: int, request: bytes) -> bytes:
        return ok() + ok(b"unasked") if conn == 1 else ok(b"fresh")

    with raw_server(script) as (url, stats):

        async def main() -> list[bytes]:
            client = HTTPClient()
            first = await client.request("GET", url + "/a")
            second = await client.request("GET", url + "/a")
            await client.close()
            return [first.body, second.body]

        assert run(main()) == [b'{"ok":true}', b"fresh"]
    assert stats["connections"] == 2
