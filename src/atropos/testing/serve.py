"""Loopback servers for tests: `serve_in_thread` (uvicorn in a thread), `send_head`, and
`answer_lifespan` for the bare ASGI stubs of tests and benchmarks."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from atropos.net import free_port


def send_head(
    url: str, head: bytes, pace: float = 0.0, piece: int = 1 << 20, timeout: float = 5.0
) -> bytes:
    """Send a raw request `head` to `url` (`http://HOST:PORT`) in pieces of `piece` bytes,
    `pace` seconds apart, from a second thread, and return what the server answers up to the
    end of its status line (b"" when it resets the connection before anything can be read).

    For probing a server's limits on request heads, which an HTTP client would not send."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:

        def push() -> None:
            try:
                for i in range(0, len(head), piece):
                    sock.sendall(head[i : i + piece])
                    if pace:
                        time.sleep(pace)
            except OSError:  # the server closed: it stopped reading
                pass

        sender = threading.Thread(target=push, daemon=True)
        sender.start()
        answer = b""
        try:
            while b"\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
        except OSError:
            pass
        sender.join(timeout=timeout)
        return answer


async def answer_lifespan(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """For a bare ASGI app: when `scope` is the lifespan's, answer its startup and shutdown
    and return True (the app returns); else False."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


@contextlib.contextmanager
def serve_in_thread(app: Any, port: int = 0, deadline: float = 10.0) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 in a daemon thread; yield its base URL.

    The server is stopped (and the thread joined) when the block exits.
    """
    import uvicorn

    from atropos.http.serve import uvicorn_config

    port = port or free_port()
    config = uvicorn_config(app, host="127.0.0.1", port=port, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn:{port}", daemon=True)
    thread.start()
    end = time.monotonic() + deadline
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            server.should_exit = True
            raise RuntimeError(f"server on port {port} did not start within {deadline} s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=deadline)


@contextlib.contextmanager
def local_tiny_server(max_model_len: int = 4096) -> Iterator[str]:
    """`atropos local serve tiny` in this process (needs torch): the shipped tiny policy on
    the CPU, served on 127.0.0.1; yields its OpenAI base URL (`.../v1`), stops it on exit."""
    from atropos.local.engine import Engine
    from atropos.local.server import LocalServer
    from atropos.tiny.warmstart import policy_path

    engine = Engine(str(policy_path()), device="cpu", max_model_len=max_model_len).start()
    try:
        with serve_in_thread(LocalServer(engine, served_model_name="atropos-tiny").app) as url:
            yield f"{url}/v1"
    finally:
        engine.close()
