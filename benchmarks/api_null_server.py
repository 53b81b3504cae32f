#!/usr/bin/env python3
"""The floor of the trajectory API: a server that parses the same requests and discards them.

`benchmarks/api_throughput.py --only ours,null` runs it beside `atropos api serve` so the API's
CPU per 1,000 groups can be read against the work no API can avoid: the same uvicorn, the same
HTTP rules (`atropos.http.server_app`), the same bounded body read and gunzip, the same UTF-8
check and the same typed msgspec decode of every group (`wire.decode_group`). What it leaves
out is the API itself: checks across fields, re-encoding, the store, the queue, the packer.

So that the benchmark's trainer can drain, `GET /batch` answers once enough sequences were
posted, with the last group received (as the bytes that came in) repeated to fill the batch:
a response of the same size as the API's, built with one `join`. `/register` and
`/register-env` answer as the API does; nothing is kept beyond counts.

Usage (the benchmark starts it): `python benchmarks/api_null_server.py --port 8001`.
"""

from __future__ import annotations

import argparse
import sys

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from atropos import wire
from atropos.cli import listen
from atropos.http import Rules, Site, api_error, body, decode, server_app

MAX_BODY = 256 * 2**20


class Null:
    """Counts and the last group; nothing else."""

    def __init__(self) -> None:
        self.batch_size = 0
        self.envs = 0
        self.sequences = 0  # posted and not yet "served"
        self.group_size = 1
        self.last = b""

    async def root(self, request: Request) -> Response:
        return Response(b'{"message":"AtroposLib API"}', media_type="application/json")

    async def register(self, request: Request) -> Response:
        reg = wire.decode(await body.read_body(request, MAX_BODY, MAX_BODY), wire.Registration)
        self.batch_size = reg.batch_size
        return Response(b'{"uuid":1}', media_type="application/json")

    async def register_env(self, request: Request) -> Response:
        await body.read_body(request, MAX_BODY, MAX_BODY)
        doc = {"status": "success", "env_id": self.envs}
        self.envs += 1
        return Response(wire.encode(doc), media_type="application/json")

    async def scored_data(self, request: Request) -> Response:
        raw = await body.read_body(request, MAX_BODY, MAX_BODY)
        decode.check_utf8(raw)
        group = wire.decode_group(raw)
        self.group_size = len(group.tokens)
        self.sequences += self.group_size
        self.last = raw
        return Response(b'{"status":"received"}', media_type="application/json")

    async def batch(self, request: Request) -> Response:
        if not self.batch_size or self.sequences < self.batch_size:
            return Response(b'{"batch":null}', media_type="application/json")
        self.sequences -= self.batch_size
        groups = [self.last] * (self.batch_size // self.group_size)
        return await body.respond(request, b'{"batch":[' + b",".join(groups) + b"]}")

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET"]),
            Route("/register", self.register, methods=["POST"]),
            Route("/register-env", self.register_env, methods=["POST"]),
            Route("/scored_data", self.scored_data, methods=["POST"]),
            Route("/batch", self.batch, methods=["GET"]),
        ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args(argv)
    rules = Rules(Site.of(args.host), ("/",), MAX_BODY, lambda path: api_error)
    app = server_app(Null().routes(), rules)
    app.state.response_gzip = "auto"
    sock = listen.bind(args.host, args.port, "api_null_server")
    listen.serve(app, sock, "warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
