"""Listening sockets of `atropos api serve` and `atropos local serve`: bound before anything
says "listening", so a busy port is one clear error and no "http://..." line is printed first.

>>> sock = bind("127.0.0.1", 0, "demo")
>>> base_url(sock).startswith("http://127.0.0.1:")
True
>>> sock.listen()  # as uvicorn does once the app is ready
>>> try:
...     bind("127.0.0.1", sock.getsockname()[1], "demo")
... except SystemExit as e:
...     print(str(e).replace(str(sock.getsockname()[1]), "N"))
demo: error: port N on 127.0.0.1 is in use: pick another with --port, or stop what listens there
>>> sock.close()
"""

from __future__ import annotations

import errno
import socket
from typing import Any

__all__ = ["add_allowed_host", "base_url", "bind", "serve"]


def add_allowed_host(p: Any) -> None:
    """The `--allowed-host NAME` flag of a server command (an argparse parser)."""
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this Host name (repeatable; '*': any). Served without"
        " it: localhost, loopback IPs and the bound address; on a non-loopback address also"
        " any IP and this machine's name, and any name when an API key is set",
    )


def bind(host: str, port: int, prog: str) -> socket.socket:
    """A socket bound to `host:port`, or SystemExit with one line saying what is wrong and
    which flag fixes it (exit status 1).

    It listens only once uvicorn serves it: until then (a model loading) a client is refused
    rather than left waiting, as before.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise SystemExit(
            f"{prog}: error: --host {host}: unknown address ({err.strerror})"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # as asyncio's create_server does: a port left in TIME_WAIT by a restart is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise SystemExit(f"{prog}: error: {_why(err, host, port)}") from None
    sock.set_inheritable(True)
    return sock


def _why(err: OSError, host: str, port: int) -> str:
    if err.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use: pick another with --port, or stop what listens there"
        )
    if err.errno == errno.EACCES:
        return f"no permission to listen on port {port} of {host}: pick one above 1023 with --port"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine: use 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on {host}:{port}: {err.strerror or err}"


def base_url(sock: socket.socket) -> str:
    """`http://HOST:PORT` of a bound socket (the port chosen by the system for --port 0)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: Any, sock: socket.socket, log_level: str) -> None:
    """Serve `app` on `sock` until SIGINT or SIGTERM (then up to 5 s for open requests);
    SystemExit(3) when the app fails to start, as `uvicorn.run` does. Request heads are bounded
    (`atropos.http.serve`: 431 past 64 KiB or 100 header fields)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from atropos.http.serve import uvicorn_config

    config = uvicorn_config(app, log_level=log_level, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C during the shutdown
        pass
    finally:
        sock.close()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)
