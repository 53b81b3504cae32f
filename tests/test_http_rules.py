"""Every server we ship is built with the one set of HTTP rules (`atropos.http`), and answers a
hostile request the same way, in its own dialect.

- No module of the package builds a Starlette app or a uvicorn server but through
  `atropos.http` (`server_app`, `guard`, `serve.uvicorn_config`): a server added later without
  the rules fails here.
- Each server (the trajectory API, `atropos local serve`, the rollout proxy, the MCP fixture
  server, the fake inference server), served on 127.0.0.1 and attacked as a web page or another
  process would: a foreign `Host` (DNS rebinding), a cross-site `Origin`, `Origin: null`,
  `Sec-Fetch-Site: cross-site`, a content type a form can send, a declared body over the limit,
  a body nested 100k levels deep and one that is not UTF-8, a request head of too many fields.
  Each is refused with its 4xx in the server's error shape (the 431 of a head, refused before
  any route is known, in the API's), never a 5xx, and an ordinary request still passes.
"""

from __future__ import annotations

import ast
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.http import rules_of
from atropos.testing import serve_in_thread

SRC = Path(__file__).resolve().parent.parent / "src" / "atropos"
BUILDERS = {"Starlette", "Config", "run"}  # Starlette(...), uvicorn.Config(...), uvicorn.run(...)


def _server_builds(path: Path) -> list[str]:
    """`file:line call` for each call in `path` that builds an app or a uvicorn server."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = (
            fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        )
        owner = (
            fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
        )
        if name == "Starlette" or (owner == "uvicorn" and name in ("Config", "run")):
            found.append(
                f"{path.relative_to(SRC)}:{node.lineno} {owner + '.' if owner else ''}{name}"
            )
    return found


def test_no_server_is_built_but_through_atropos_http() -> None:
    outside = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if "http" not in path.relative_to(SRC).parts[:1]
        for hit in _server_builds(path)
    ]
    assert not outside, (
        "servers built without the HTTP rules (use atropos.http.server_app / guard and"
        " atropos.http.serve.uvicorn_config):\n" + "\n".join(outside)
    )


# ----- the servers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A server under attack: its URL, a route that reads, a route that takes JSON, a valid body
    for it (`HOLE`, a string, is where hostile values go), extra headers its clients send, its
    dialect's error check and its status for a body that breaks its protocol."""

    url: str
    read: str
    write: str
    body: dict[str, Any]
    shape: Callable[[Any], bool]
    headers: dict[str, str]
    invalid: tuple[int, ...] = (400,)  # the API: 422 for a body breaking its protocol (FastAPI's)

    def content(self, value: bytes = b'"x"') -> bytes:
        """The valid body with `value` (raw JSON bytes) where `HOLE` is."""
        return json.dumps(self.body).encode().replace(b'"' + HOLE.encode() + b'"', value)


HOLE = "@hole@"


def _api_shape(body: Any) -> bool:
    return isinstance(body.get("error"), dict) and isinstance(body.get("detail"), str)


def _openai_shape(body: Any) -> bool:
    error = body.get("error")
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


def _jsonrpc_shape(body: Any) -> bool:
    return body.get("jsonrpc") == "2.0" and isinstance(body.get("error", {}).get("code"), int)


@contextlib.contextmanager
def _api() -> Iterator[Target]:
    from atropos.api.app import create_app

    app = create_app()
    assert rules_of(app) is not None
    with serve_in_thread(app) as url:
        body = {"wandb_group": HOLE, "wandb_project": "p", "batch_size": 1, "max_token_len": 8}
        body |= {"checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0}
        body |= {"num_steps": 1}
        yield Target(url, "/latest_example", "/register", body, _api_shape, {}, (400, 422))


@contextlib.contextmanager
def _local() -> Iterator[Target]:
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server(max_model_len=256) as base:
        url = base.removesuffix("/v1")
        body = {"model": "atropos-tiny", "prompt": HOLE, "max_tokens": 1}
        yield Target(url, "/v1/models", "/v1/completions", body, _openai_shape, {})


@contextlib.contextmanager
def _fake() -> Iterator[Target]:
    from atropos.testing.fake_server import FakeInferenceServer

    server = FakeInferenceServer()
    assert rules_of(server.app) is not None
    with serve_in_thread(server.app) as url:
        body = {"model": "atropos-tiny", "prompt": HOLE, "max_tokens": 1}
        yield Target(url, "/v1/models", "/v1/completions", body, _openai_shape, {})


@contextlib.contextmanager
def _proxy() -> Iterator[Target]:
    from atropos.inference.config import APIServerConfig
    from atropos.inference.manager import ServerManager, ServerManagerConfig
    from atropos.inference.tokenizer import load_tokenizer
    from atropos.proxy.app import Proxy, ProxySettings, build_app
    from atropos.testing.fake_server import FakeInferenceServer

    fake = FakeInferenceServer()
    with serve_in_thread(fake.app) as upstream:
        config = APIServerConfig(base_url=upstream + "/v1", server_type="openai", model_name="t")
        manager = ServerManager([config], ServerManagerConfig())
        proxy = Proxy(manager, load_tokenizer("tiny"), ProxySettings(model="t"), text_only=True)
        app = build_app(proxy)
        assert rules_of(app) is not None
        with serve_in_thread(app) as url:
            body = {"metadata": {"note": HOLE}}
            yield Target(url, "/v1/models", "/sessions", body, _openai_shape, {})


@contextlib.contextmanager
def _mcp() -> Iterator[Target]:
    pytest.importorskip("mcp")
    from atropos.environments.mcp_tools.fixture_server import http_app

    app = http_app()
    assert rules_of(app) is not None
    accept = {"accept": "application/json, text/event-stream"}
    client = {"name": HOLE, "version": "1"}
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    with serve_in_thread(app) as url:
        yield Target(url, "/mcp", "/mcp", hello, _jsonrpc_shape, accept)


SERVERS = {"api": _api, "local": _local, "fake": _fake, "proxy": _proxy, "mcp": _mcp}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with SERVERS[request.param]() as found:
        yield found


# ----- the attacks ---------------------------------------------------------------------------

PAGE = {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}
UNREAD = b"<an extra key>"  # the valid body with a key no route reads, holding bytes not UTF-8
HOSTILE: dict[str, tuple[str, dict[str, str], bytes | None, int]] = {
    # name: (method, headers, value at HOLE (None: a string), status (0: the server's `invalid`))
    "rebound Host, read": ("GET", {"host": "evil.example"}, b"", 403),
    "rebound Host, write": ("POST", {"host": "evil.example"}, None, 403),
    "cross-site page": ("POST", PAGE, None, 403),
    "Origin: null": ("POST", {"origin": "null"}, None, 403),
    "same-site page": ("POST", {"sec-fetch-site": "same-site"}, None, 403),
    "form content type": ("POST", {"content-type": "text/plain"}, None, 415),
    "urlencoded form": ("POST", {"content-type": "application/x-www-form-urlencoded"}, None, 415),
    "nested 100k deep": ("POST", {}, b"[" * 100_000 + b"]" * 100_000, 0),
    "not UTF-8": ("POST", {}, b'"\xff\xfe"', 0),
    "not UTF-8 in a key no route reads": ("POST", {}, UNREAD, 0),
    "not JSON": ("POST", {}, b"{", 0),
}


def _send(target: Target, method: str, headers: dict[str, str], body: bytes | None) -> Any:
    path = target.read if method == "GET" else target.write
    content = target.content() if body is None else target.content(body)
    if body == UNREAD:
        content = target.content().replace(b"{", b'{"zz": "\xff\xfe", ', 1)
    sent = {"content-type": "application/json", **target.headers, **headers}
    with httpx.Client(base_url=target.url, timeout=60) as client:
        if method == "GET":
            return client.get(path, headers=sent)
        return client.post(path, content=content, headers=sent)


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_request_gets_its_4xx_in_the_dialect(target: Target, attack: str) -> None:
    method, headers, body, expected = HOSTILE[attack]
    answer = _send(target, method, headers, body)
    allowed = (expected,) if expected else target.invalid
    assert answer.status_code in allowed, (attack, answer.status_code, answer.text[:300])
    assert target.shape(answer.json()), answer.text[:300]


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(target: Target) -> None:
    host, port = target.url.removeprefix("http://").split(":")
    head = (
        f"POST {target.write} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        answer = sock.recv(65536).decode("latin-1")
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert target.shape(json.loads(answer.partition("\r\n\r\n")[2])), answer


def test_an_ordinary_request_passes(target: Target) -> None:
    answer = _send(target, "POST", {}, None)
    assert answer.status_code < 300 or answer.status_code in (401, 422), answer.text[:300]
    assert _send(target, "GET", {}, b"").status_code not in (403, 415)


def test_a_request_head_over_the_limit_is_a_431(target: Target) -> None:
    from atropos.http.heads import MAX_HEADERS

    headers = {f"x-filler-{i}": "y" for i in range(MAX_HEADERS + 1)}
    with httpx.Client(base_url=target.url, timeout=60) as client:
        answer = client.get(target.read, headers=headers)
    assert answer.status_code == 431, answer.text[:300]


def _echo_app() -> Any:
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from atropos.http import Rules, server_app

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text(await ws.receive_text())
        await ws.close()

    return server_app([WebSocketRoute("/ws", echo)], Rules.loopback())


def _handshake(url: str, headers: dict[str, str]) -> bytes:
    """The status line the server answers a WebSocket handshake with."""
    host, port = url.removeprefix("http://").split(":")
    lines = ["GET /ws HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade"]
    lines += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return sock.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, b"101"),
        ({"Origin": "http://127.0.0.1:{port}"}, b"101"),
        ({"Origin": "https://evil.example"}, b"403"),
        ({"Origin": "null"}, b"403"),
        ({"Host": "evil.example"}, b"403"),
    ],
)
def test_a_websocket_handshake_passes_the_host_and_origin_rules(
    headers: dict[str, str], status: bytes
) -> None:
    # browsers let any page open a WebSocket anywhere (no CORS): the Origin is the only guard
    with serve_in_thread(_echo_app()) as url:
        port = url.rsplit(":", 1)[1]
        sent = {"Host": f"127.0.0.1:{port}"} | {k: v.format(port=port) for k, v in headers.items()}
        assert _handshake(url, sent).split(b" ")[1] == status
