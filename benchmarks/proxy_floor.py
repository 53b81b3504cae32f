#!/usr/bin/env python3
"""The floor of the rollout proxy: a server that takes the same requests and forwards them.

`benchmarks/proxy_overhead.py --only floor` runs it where `atropos proxy serve` runs, so the
proxy's CPU per request can be read against the work no proxy in front of an inference server
can avoid: the same uvicorn (`cli.listen.serve`), the same HTTP rules (`atropos.http.guard`),
the body read and decoded with msgspec, one request to the inference server with the same
client (`inference.http.HTTPClient`, keep-alive) and its answer sent back as it came. What it
leaves out is the proxy itself: sessions and keys, the chat template, token ids, sequences,
the answer's parsing and re-encoding. The server renders the template itself (as `direct`).

Routes: `GET /health`, `POST /sessions` (`{id, api_key}`), `POST /s/{id}/v1/chat/completions`.

Usage (the benchmark starts it): `python benchmarks/proxy_floor.py --port 8002 --server URL`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

import msgspec

from atropos.cli import listen
from atropos.http import Rules, Site, guard
from atropos.inference.http import HTTPClient
from atropos.testing import answer_lifespan

MAX_BODY = 8 << 20
_JSON = [(b"content-type", b"application/json")]


class Floor:
    """The ASGI app: forwards chat bodies to `server` (its `/v1` base URL)."""

    def __init__(self, server: str) -> None:
        self.url = server.rstrip("/") + "/chat/completions"
        self.client = HTTPClient({"Content-Type": "application/json"})
        self.ids = itertools.count()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        path = scope["path"]
        status, answer = 200, b'{"status":"ok"}'
        if path == "/sessions":
            n = next(self.ids)
            answer = msgspec.json.encode({"id": f"s{n}", "api_key": f"k{n}"})
        elif path.endswith("/chat/completions"):
            msgspec.json.decode(raw)  # a proxy reads the request
            reply = await self.client.request("POST", self.url, raw)
            status, answer = reply.status, reply.body
        head = [*_JSON, (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": answer})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--server", required=True, help="the inference server's /v1 base URL")
    args = p.parse_args(argv)
    rules = Rules(Site.of(args.host, (), False), ("/health",), MAX_BODY, lambda path: _error)
    app = guard(Floor(args.server), rules)
    sock = listen.bind(args.host, args.port, "proxy_floor")
    listen.serve(app, sock, "warning")
    return 0


def _error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param}}


if __name__ == "__main__":
    sys.exit(main())
