#!/usr/bin/env python3
"""An adversarial probe of every server we ship, as a web page or another local process would
attack it, all on 127.0.0.1: the trajectory API (`atropos api serve`), `atropos local serve
tiny` (no key, as a default user runs it; and once with `--api-key` for the key classes), the
rollout proxy (`atropos proxy serve` over the fake inference server), the MCP fixture server
(`python -m atropos.environments.mcp_tools.fixture_server --http PORT`) and the fake inference
server (`python -m atropos.testing.fake_server`). Each is a subprocess, stopped by its process
group at the end on every exit path (Ctrl-C included).

Every request of every class below MUST be refused; for each we record the server, the class,
the request and the status. A request is

- **refused** when it gets a 4xx (or the server closes the connection without an answer,
  `reset`, counted apart as `other` with any 1xx/3xx);
- **through** when it gets a 2xx: the server did what a refused request must not do;
- **5xx** when the server failed on it (input must never get a 5xx).

After each class the server's state is checked against the state before it, and a change is
one more *through* (a row `state` with what changed): the API's queue (`/status` queue_size and
current_step) and registration (`/wandb_info`); local serve's `/health` policy_version, its
`/is_paused`, its adapters (`/v1/models`) and one ordinary completion answered (not blocked);
the proxy's victim session (still there, same turns and reward, from its own key); the fake
server's `/health`. The MCP fixture server keeps no state.

The classes (each sent to each server where it applies):

- `foreign Host`: every route (reads, writes, `/health` too) with a Host that is not this
  machine's (DNS rebinding): `evil.example`, `evil.example:PORT`, `localhost.evil.example:PORT`,
  `127.0.0.1.nip.io:PORT`. Must be 403 on every route.
- `cross-site Origin`: every route but GET of the pages that hold no data (`/health`; the
  API's `/` and `/dashboard`), `Origin` another site, another port, or a look-alike
  (`http://127.0.0.1:PORT.evil.example`). `Origin: null`, `Sec-Fetch-Site: cross-site` /
  `same-site` (without Origin, as an `<img>` or a navigation sends it): the same routes.
- `form content type`: every write with `text/plain`, a urlencoded or a multipart form (what a
  page can send without a preflight): 415.
- `gzip bomb`: 1 MB that inflates to 1 GiB, `Content-Encoding: gzip`, to each JSON route that
  matters (a server that does not inflate must still refuse it: not JSON).
- `huge headers`: one header of 16 MiB, one of 1 MiB, 10,000 headers, 200 headers (431 or a
  reset).
- `body over limit (declared)`: `Content-Length` of the limit + 1, 10**11 and 10**30, nothing
  sent after the head (413 before a byte is read). `body over limit (chunked)`: a chunked body
  one MiB over the server's limit (API 256 MiB, proxy 8 MiB, the rest 64 MiB).
- `deep JSON`: `[` x 100,000 to every JSON route. `invalid UTF-8`: an ordinary body with one
  more key whose string is `\\xff\\xfe`, to every JSON route.
- `numeric fields`: each numeric field of each route (the API's registration, env, group and
  policy_version fields; OpenAI's `max_tokens`, `max_completion_tokens`, `temperature`,
  `top_p`, `n`, `logprobs`, `top_logprobs`, `seed`; the Responses API's `max_output_tokens`;
  Anthropic's `max_tokens`) set to 2**64, 10**400, -(2**64), "x", [1] and {"n": 1} (float
  fields without a bound get only 10**400 and the wrong types, since 2**64 is a float).
- `10k tools`: a chat with 10,000 function tools, which fits no context of the servers here
  (4,096 tokens at most). `stream_options "yes"`: a streamed chat or completion with
  `stream_options: "yes"`. `bad query integer`: the API's `env_id`, `after`, `limit` (ints) and
  `lease` (seconds) as `x`, `1e3`, `²`, 25 nines, `-5`, `1_0`, empty, `0x10`, `nan`, `inf`.

The new classes:

- `no key (key set)` (local serve with `--api-key K`): every route but `/health` (reads,
  completions, weights, LoRA, every transfer and pause route) with no Authorization, a wrong
  key, an empty bearer, K plus one character, and K less its last: 401.
- `rendezvous not loopback` (local serve, without a key, and with the key for an authorized
  caller): vLLM's and SGLang's init routes with a `master_address` of another machine
  (private, public, link-local metadata, 0.0.0.0, mapped IPv6, names): 403 (loopback only by
  default). The servers run with `--transfer-rendezvous-timeout 3`, so an address let through
  costs 3 s and answers 504.
- `path outside allowed dirs` (the same two servers): `/update_weights_from_disk` and
  `/v1/load_lora_adapter` with `/etc`, `/etc/passwd`, `../` escapes, a symlink in an allowed
  dir that points to `/etc`, 5,000-character names, NUL bytes, `~`, `file://`; and
  `/v1/unload_lora_adapter` with such names. The servers run in a temporary working
  directory (allowed by default, with the system temp dir).
- `another session's id` (proxy): a victim session is created (`POST /sessions`) and takes one
  turn; an attacker holds its own session's key (a proxy without a key lets anyone create one,
  a rebound page included) and calls every session route of the victim by its public id
  (`/sessions/ID/trajectory`, `/reward`, `DELETE`, `/s/ID/v1/...` in all four dialects) with
  no key, its own key as bearer or `x-api-key`, the id as bearer, or `X-Session-ID`; plus
  `GET /sessions`. `upstream uuid = public id`: upstream's `/{uuid}/v1/chat/completions`,
  `/{uuid}/nodes` and `DELETE /{uuid}` with the victim's id (and its upper-case form) in place
  of the capability.

The browser classes on the proxy carry the attacker's session key (a page can get one, above),
so that a missing rule shows as a 2xx rather than hiding behind a 401.

Usage:
    .venv/bin/python benchmarks/hostile_probe.py
    .venv/bin/python benchmarks/hostile_probe.py --json runs/hostile_probe.json
    .venv/bin/python benchmarks/hostile_probe.py --only proxy,fake

Exit status 1 when any request got through or any 5xx was seen.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from atropos.demo import Service, wait_until_up
from atropos.testing import free_port, send_head

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import code_version  # noqa: E402

MEMBER = gzip.compress(b"\0" * (16 << 20), 9)
BOMB = MEMBER * 64  # about 1 MB that inflates to 1 GiB
KEY = "probe-key-0123456789"
HOSTS = ["evil.example", "evil.example:{port}", "localhost.evil.example:{port}"]
HOSTS += ["127.0.0.1.nip.io:{port}"]
ORIGINS = ["http://evil.example", "https://evil.example", "http://127.0.0.1:{other}"]
ORIGINS += ["http://127.0.0.1:{port}.evil.example"]
FORMS = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
INT_BAD: list[Any] = [2**64, 10**400, -(2**64), "x", [1], {"n": 1}]
FLOAT_BAD: list[Any] = [10**400, "x", [1], {"n": 1}]
QUERY_INT_BAD = ["x", "1e3", "²", "9" * 25, "-5", "1_0", "", "0x10"]
QUERY_SECONDS_BAD = ["x", "nan", "inf", "-5", "0", "1e400"]
ADDRESSES = ["10.0.0.1", "192.168.1.1", "8.8.8.8", "169.254.169.254", "0.0.0.0", "::ffff:8.8.8.8"]
ADDRESSES += ["fe80::1", "example.com", "localhost.evil.example", "127.0.0.1.nip.io", "0x08080808"]
AUTH_VARIANTS = {
    "no key": {},
    "wrong key": {"authorization": "Bearer wrong"},
    "empty bearer": {"authorization": "Bearer"},
    "key+1": {"authorization": f"Bearer {KEY}x"},
    "key-1": {"authorization": f"Bearer {KEY[:-1]}"},
}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OPENAI_INTS = ["max_tokens", "n", "logprobs", "seed"]
CHAT_INTS = ["max_tokens", "max_completion_tokens", "n", "top_logprobs", "seed", "logprobs"]
BOUNDED_FLOATS = ["temperature", "top_p"]


@dataclass
class Route:
    method: str
    path: str
    body: dict[str, Any] | list[Any] | None = None  # an ordinary body (None: none sent)
    json: bool = False  # takes a JSON body
    ints: list[str] = field(default_factory=list)  # numeric fields probed with INT_BAD
    floats: list[str] = field(default_factory=list)  # bounded floats: INT_BAD
    open_floats: list[str] = field(default_factory=list)  # unbounded floats: FLOAT_BAD


@dataclass
class Server:
    """A server under probe: where it is, its routes and how to read its state."""

    name: str
    url: str
    routes: list[Route]
    limit: int  # body limit in bytes
    open_paths: tuple[str, ...] = ("/health",)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every probe
    state: Callable[[], Any] = lambda: None
    restore: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@dataclass
class Probe:
    cls: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    variant: str = ""
    raw: Callable[[], str] | None = None  # a request no HTTP client sends: its status
    bare: bool = False  # without the server's usual headers (the proxy's attacker key)


# ----- raw requests ---------------------------------------------------------------------------


def status_of(answer: bytes) -> str:
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else "reset"


def raw_head(url: str, head: bytes) -> str:
    return status_of(send_head(url, head, timeout=60))


def raw_chunked(url: str, path: str, size: int) -> str:
    """POST a chunked body of `size` bytes; stop sending as soon as the server answers."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        try:
            sock.sendall(head)
            for _ in range(size // (1 << 20) + 1):
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered (or closed) mid-body
                sock.sendall(piece)
            else:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
    return status_of(answer)


def raw_declared(url: str, path: str, length: int) -> str:
    port = url.rsplit(":", 1)[1]
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    return raw_head(url, head)


# ----- the classes ----------------------------------------------------------------------------


def _fill(template: str, server: Server) -> str:
    return template.format(port=server.port, other=server.port + 1)


def _body(route: Route) -> bytes | None:
    return None if route.body is None else json.dumps(route.body).encode()


def _with(route: Route, name: str, value: Any) -> bytes:
    assert isinstance(route.body, dict)
    return json.dumps({**route.body, name: value}).encode()


def browser_classes(s: Server) -> dict[str, list[Probe]]:
    guarded = [r for r in s.routes if not (r.method == "GET" and r.path in s.open_paths)]
    writes = [r for r in s.routes if r.method not in ("GET", "HEAD")]
    out: dict[str, list[Probe]] = {"foreign Host": [], "cross-site Origin": []}
    for r in s.routes:
        for h in HOSTS:
            host = _fill(h, s)
            out["foreign Host"].append(Probe("", r.method, r.path, {"host": host}, _body(r), host))
    for r in guarded:
        for o in ORIGINS:
            origin = _fill(o, s)
            out["cross-site Origin"].append(
                Probe("", r.method, r.path, {"origin": origin}, _body(r), origin)
            )
    out["Origin: null"] = [
        Probe("", r.method, r.path, {"origin": "null"}, _body(r)) for r in guarded
    ]
    out["Sec-Fetch-Site cross/same-site"] = [
        Probe("", r.method, r.path, {"sec-fetch-site": v}, _body(r), v)
        for r in guarded
        for v in ("cross-site", "same-site")
    ]
    out["form content type"] = [
        Probe("", r.method, r.path, {"content-type": t}, _body(r) or b"a=b", t.split(";")[0])
        for r in writes
        for t in FORMS
    ]
    return out


def body_classes(s: Server) -> dict[str, list[Probe]]:
    jsons = [r for r in s.routes if r.json]
    main = s.extra.get("main_writes", [r.path for r in jsons][:2])
    read = next(r.path for r in s.routes if r.method == "GET")
    deep = b"[" * 100_000 + b"]" * 100_000
    gz = {"content-encoding": "gzip"}

    def head(extra: bytes) -> bytes:
        return f"GET {read} HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n".encode() + extra + b"\r\n"

    heads = {
        "one 16 MiB header": head(b"X-Big: " + b"a" * (16 << 20) + b"\r\n"),
        "one 1 MiB header": head(b"X-Big: " + b"a" * (1 << 20) + b"\r\n"),
        "10,000 headers": head(b"".join(b"X-%d: v\r\n" % i for i in range(10_000))),
        "200 headers": head(b"".join(b"X-%d: v\r\n" % i for i in range(200))),
    }
    url = s.url
    return {
        "gzip bomb": [Probe("", "POST", p, gz, BOMB, "1 MB -> 1 GiB") for p in main],
        "huge headers": [
            Probe("", "GET", read, variant=name, raw=functools.partial(raw_head, url, h))
            for name, h in heads.items()
        ],
        "body over limit (declared)": [
            Probe("", "POST", p, variant=str(n), raw=functools.partial(raw_declared, url, p, n))
            for p in main
            for n in (s.limit + 1, 10**11, 10**30)
        ],
        "body over limit (chunked)": [
            Probe(
                "",
                "POST",
                main[0],
                variant=f"{s.limit + (1 << 20)} bytes",
                raw=lambda: raw_chunked(url, main[0], s.limit + (1 << 20)),
            )
        ],  # fmt: skip
        "deep JSON": [Probe("", r.method, r.path, {}, deep, "100k levels") for r in jsons],
        "invalid UTF-8": [
            Probe("", r.method, r.path, {}, body, where) for r in jsons for where, body in _utf8(r)
        ],
    }


def _utf8(r: Route) -> list[tuple[str, bytes]]:
    """The route's body with `\\xff\\xfe` as one more key's string, and as its first string
    field's value (when it has one)."""
    if not (isinstance(r.body, dict) and r.body):
        return [("one more key", b'{"zz": "\xff\xfe"}')]
    raw = json.dumps(r.body).encode()
    out = [("one more key", raw[:-1] + b', "zz": "\xff\xfe"}')]
    name = next((k for k, v in r.body.items() if isinstance(v, str)), None)
    if name is not None:
        out.append((f"in {name}", json.dumps({**r.body, name: "@@"}).encode().replace(
            b'"@@"', b'"\xff\xfe"')))  # fmt: skip
    return out


def field_classes(s: Server) -> dict[str, list[Probe]]:
    numeric: list[Probe] = []
    for r in s.routes:
        for name in r.ints + r.floats:
            for v in INT_BAD:
                numeric.append(Probe("", r.method, r.path, {}, _with(r, name, v), _show(name, v)))
        for name in r.open_floats:
            for v in FLOAT_BAD:
                numeric.append(Probe("", r.method, r.path, {}, _with(r, name, v), _show(name, v)))
    out = {"numeric fields": numeric}
    chats = s.extra.get("chats", [])
    if chats:
        tools = [
            {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
            for i in range(10_000)
        ]
        out["10k tools"] = [
            Probe("", "POST", r.path, {}, _with(r, "tools", tools), "10,000") for r in chats
        ]
    streams = s.extra.get("streams", [])
    if streams:
        out['stream_options "yes"'] = [
            Probe("", "POST", r.path, {}, json.dumps({**r.body, "stream": True,
                                                      "stream_options": "yes"}).encode())
            for r in streams
        ]  # fmt: skip
    queries = s.extra.get("queries", [])
    if queries:
        out["bad query integer"] = [
            Probe(
                "", "GET", f"{path}{'&' if '?' in path else '?'}{name}={v}", variant=f"{name}={v}"
            )
            for path, name, seconds in queries
            for v in (QUERY_SECONDS_BAD if seconds else QUERY_INT_BAD)
        ]
    return out


def _show(name: str, value: Any) -> str:
    text = json.dumps(value)
    return f"{name}={text if len(text) < 24 else text[:10] + '...(' + str(len(text)) + ')'}"


# ----- sending --------------------------------------------------------------------------------


def send(client: httpx.Client, s: Server, p: Probe) -> str:
    if p.raw is not None:
        return p.raw()
    usual = {} if p.bare else s.headers
    headers = {"content-type": "application/json", **usual, **p.headers}
    if p.content is None:
        headers.pop("content-type")
    try:
        r = client.request(p.method, p.path, content=p.content, headers=headers)
    except httpx.HTTPError as err:
        return f"error:{type(err).__name__}"
    return str(r.status_code)


def verdict(status: str) -> str:
    if status.isdigit():
        code = int(status)
        if 200 <= code < 300:
            return "through"
        if 400 <= code < 500:
            return "refused"
        if code >= 500:
            return "5xx"
    return "other"


def run_class(
    client: httpx.Client, s: Server, cls: str, probes: list[Probe], rows: list[dict[str, Any]]
) -> None:
    before = s.state()
    counts = {"refused": 0, "through": 0, "5xx": 0, "other": 0}
    for p in probes:
        status = send(client, s, p)
        v = verdict(status)
        counts[v] += 1
        rows.append(
            {
                "server": s.name, "class": cls, "method": p.method, "path": p.path[:120],
                "variant": p.variant[:120], "status": status, "verdict": v,
            }
        )  # fmt: skip
    after = s.state()
    changed = ""
    if after != before:
        changed = f"state changed: {before!r} -> {after!r}"
        counts["through"] += 1
        rows.append(
            {
                "server": s.name, "class": cls, "method": "", "path": "state", "variant": changed,
                "status": "state", "verdict": "through",
            }
        )  # fmt: skip
        s.restore()
    line = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    print(f"  {s.name:9s} {cls:32s} {len(probes):4d} requests: {line} {changed}", flush=True)


def probe_server(s: Server, classes: dict[str, list[Probe]], rows: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=s.url, timeout=120) as client:
        for cls, probes in classes.items():
            if probes:
                run_class(client, s, cls, probes, rows)


def old_classes(s: Server) -> dict[str, list[Probe]]:
    return {**browser_classes(s), **body_classes(s), **field_classes(s)}


# ----- the servers ----------------------------------------------------------------------------


class Fleet:
    """The server processes started, each stopped by its process group on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.services: list[Service] = []

    def start(self, name: str, argv: list[str], health: str, cwd: Path | None = None) -> str:
        port = free_port()
        argv = [a.replace("{port}", str(port)) for a in argv]
        service = Service(name, argv, self.tmp / f"{name}.log")
        self.services.append(service)
        if cwd is None:
            service.start()
        else:
            old = os.getcwd()
            os.chdir(cwd)
            try:
                service.start()
            finally:
                os.chdir(old)
        url = f"http://127.0.0.1:{port}"
        if health:
            wait_until_up(url + health, deadline=180, service=service)
        else:  # any answer will do
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    httpx.get(url, timeout=1.0)
                    break
                time.sleep(0.1)
        return url

    def stop(self) -> None:
        for service in reversed(self.services):
            with contextlib.suppress(Exception):
                service.stop(grace=10)


def _get(url: str, path: str, headers: dict[str, str] | None = None) -> Any:
    r = httpx.get(url + path, headers=headers or {}, timeout=30)
    return r.status_code, r.json() if r.headers.get("content-type", "").startswith(
        "application/json"
    ) else r.text[:200]


def _post(url: str, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    return httpx.post(url + path, json=body, headers=headers or {}, timeout=60)


def api_server(fleet: Fleet) -> Server:
    py = sys.executable
    argv = [py, "-m", "atropos", "api", "serve", "--port", "{port}"]
    argv += ["--store", f"sqlite:{fleet.tmp}/api.db"]
    url = fleet.start("api", argv, "/health")
    reg = {"wandb_group": "g", "wandb_project": "p", "batch_size": 64, "max_token_len": 64}
    reg |= {"checkpoint_dir": "c", "save_checkpoint_interval": 0, "starting_step": 0}
    reg |= {"num_steps": 10}
    env = {"max_token_length": 64, "desired_name": "env", "weight": 1.0, "group_size": 2}
    group = {
        "tokens": [[1, 2, 3], [1, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]],
        "scores": [1.0, -1.0], "env_id": 0,
    }  # fmt: skip
    _post(url, "/register", reg).raise_for_status()
    _get(url, "/batch")  # the trainer has started
    for path, body in (("/register-env", env), ("/scored_data", group)):
        r = _post(url, path, body)
        if r.status_code != 200:
            raise RuntimeError(f"POST {path}: {r.status_code} {r.text[:300]}")
    routes = [
        *(Route("GET", p) for p in ("/", "/health", "/wandb_info", "/info", "/batch")),
        *(Route("GET", p) for p in ("/latest_example", "/status", "/status-env?env_id=0")),
        *(Route("GET", p) for p in ("/reset_data", "/stats", "/stats/history", "/rollouts")),
        *(Route("GET", p) for p in ("/metrics", "/openapi.json", "/dashboard")),
        Route("POST", "/register", reg, True, ["batch_size", "max_token_len", "num_steps",
                                                 "starting_step", "save_checkpoint_interval"]),
        Route("POST", "/register-env", env, True, ["max_token_length", "group_size"],
              open_floats=["weight"]),
        Route("POST", "/disconnect-env", {"env_id": 0}, True, ["env_id"]),
        Route("POST", "/batch/ack", {"batch_id": 0}, True, ["batch_id"]),
        Route("POST", "/policy_version", {"policy_version": 1}, True, ["policy_version"]),
        Route("POST", "/scored_data", group, True, ["env_id"], open_floats=["scores"]),
        Route("POST", "/scored_data_list", [group], True),
        Route("POST", "/status-env", {"env_id": 0}, True, ["env_id"]),
        Route("POST", "/reset_data"),
    ]  # fmt: skip

    def state() -> Any:
        return _get(url, "/status")[1], _get(url, "/wandb_info")[1]

    queries = [("/status-env", "env_id", False), ("/rollouts", "after", False)]
    queries += [("/rollouts", "limit", False), ("/batch", "lease", True)]
    extra = {"main_writes": ["/scored_data", "/scored_data_list", "/register"], "queries": queries}
    return Server("api", url, routes, 256 << 20, ("/health", "/", "/dashboard"), {}, state,
                  extra=extra)  # fmt: skip


def openai_routes(model: str, prompt_field: str = "prompt") -> list[Route]:
    comp = {"model": model, prompt_field: "hi", "max_tokens": 2}
    chat = {"model": model, **CHAT}
    return [
        Route("POST", "/v1/completions", comp, True, OPENAI_INTS, BOUNDED_FLOATS),
        Route("POST", "/v1/chat/completions", chat, True, CHAT_INTS, BOUNDED_FLOATS),
    ]


def _openai_extra(routes: list[Route]) -> dict[str, Any]:
    chats = [r for r in routes if r.path.endswith("chat/completions")]
    streams = [r for r in routes if r.path.endswith("completions")]
    return {"main_writes": [r.path for r in streams], "chats": chats, "streams": streams}


def local_server(fleet: Fleet, keyed: bool) -> Server:
    name = "local-key" if keyed else "local"
    work = fleet.tmp / name
    work.mkdir()
    (work / "etc_link").symlink_to("/etc")
    argv = [sys.executable, "-m", "atropos", "local", "serve", "tiny", "--port", "{port}"]
    argv += ["--transfer-rendezvous-timeout", "3"]
    if keyed:
        argv += ["--api-key", KEY]
    url = fleet.start(name, argv, "/health", cwd=work)
    auth = {"authorization": f"Bearer {KEY}"} if keyed else {}
    model = _get(url, "/v1/models", auth)[1]["data"][0]["id"]
    from atropos.tiny.warmstart import policy_path

    init = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1}
    init |= {"world_size": 2}
    routes = [
        Route("GET", "/health"), Route("GET", "/v1/models"), Route("GET", "/is_paused"),
        Route("GET", "/get_world_size"), Route("GET", "/weights_checksum"),
        *openai_routes(model),
        Route("POST", "/update_weights_from_disk", {"model_path": str(policy_path())}, True),
        Route("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(work)}, True),
        Route("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}, True),
        Route("POST", "/init_weight_transfer_engine", {"init_info": init}, True),
        Route("POST", "/start_weight_update", {}, True),
        Route("POST", "/update_weights", {"update_info": {"names": []}}, True),
        Route("POST", "/finish_weight_update", {}, True),
        Route("POST", "/pause?mode=keep"), Route("POST", "/resume"),
        Route("POST", "/init_weights_update_group", {**init, "backend": "gloo"}, True),
        Route("POST", "/update_weights_from_distributed", {"names": []}, True),
        Route("POST", "/begin_weight_update", {"selector": "all"}, True),
        Route("POST", "/end_weight_update", {}, True),
        Route("POST", "/pause_generation", {"mode": "in_place"}, True),
        Route("POST", "/continue_generation", {}, True),
    ]  # fmt: skip

    def state() -> Any:
        version = _get(url, "/health")[1].get("policy_version")
        paused = _get(url, "/is_paused", auth)[1]
        adapters = sorted(m["id"] for m in _get(url, "/v1/models", auth)[1]["data"])
        body = {"model": model, "prompt": "hi", "max_tokens": 1}
        try:
            done = _post(url, "/v1/completions", body, auth).status_code
        except httpx.HTTPError as err:
            done = type(err).__name__
        return {"policy_version": version, "paused": paused, "models": adapters, "completion": done}

    def restore() -> None:
        for path in ("/end_weight_update", "/resume"):
            with contextlib.suppress(httpx.HTTPError):
                _post(url, path, {}, auth)

    server = Server(name, url, routes, 64 << 20, ("/health",), {}, state, restore)
    server.extra = _openai_extra(routes[5:7]) | {"model": model, "auth": auth, "work": work}
    return server


def local_new_classes(s: Server, keyed: bool) -> dict[str, list[Probe]]:
    auth: dict[str, str] = s.extra["auth"]
    work: Path = s.extra["work"]
    out: dict[str, list[Probe]] = {}
    if keyed:
        out["no key (key set)"] = [
            Probe("", r.method, r.path, h, _body(r), v)
            for r in s.routes
            if r.path != "/health"
            for v, h in AUTH_VARIANTS.items()
        ]
    rendezvous: list[Probe] = []
    for address in ADDRESSES:
        info = {"master_address": address, "master_port": 29500, "rank_offset": 1}
        info |= {"world_size": 2}
        vllm = json.dumps({"init_info": info}).encode()
        sglang = json.dumps({**info, "backend": "gloo", "group_name": "g"}).encode()
        rendezvous.append(Probe("", "POST", "/init_weight_transfer_engine", auth, vllm, address))
        rendezvous.append(Probe("", "POST", "/init_weights_update_group", auth, sglang, address))
    out["rendezvous not loopback"] = rendezvous
    paths = ["/etc", "/etc/passwd", "/root", "/proc/self/root/etc", "../../../../etc"]
    paths += [f"{work}/../../../etc", f"{work}/etc_link", f"{work}/etc_link/ssl", "a" * 5000]
    paths += ["/" + "a" * 5000, f"{work}/x\x00/etc", "\x00", "~/.ssh", "file:///etc", "//etc"]
    paths += [f"{work}/" + "a/" * 2500]
    escapes: list[Probe] = []
    for path in paths:
        shown = repr(path if len(path) < 40 else path[:20] + f"...({len(path)})")
        reload = json.dumps({"model_path": path}).encode()
        lora = json.dumps({"lora_name": "x", "lora_path": path}).encode()
        escapes.append(Probe("", "POST", "/update_weights_from_disk", auth, reload, shown))
        escapes.append(Probe("", "POST", "/v1/load_lora_adapter", auth, lora, shown))
    for name in ("a" * 5000, "x\x00y", "../x", "/etc/passwd"):
        body = json.dumps({"lora_name": name}).encode()
        escapes.append(Probe("", "POST", "/v1/unload_lora_adapter", auth, body, repr(name[:20])))
    out["path outside allowed dirs"] = escapes
    return out


def fake_server(fleet: Fleet) -> Server:
    argv = [sys.executable, "-m", "atropos.testing.fake_server", "--port", "{port}"]
    url = fleet.start("fake", argv, "/health")
    gen = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    routes = [
        Route("GET", "/health"), Route("GET", "/health/"), Route("GET", "/v1/models"),
        *openai_routes("atropos-tiny"),
        Route("POST", "/generate", gen, True),
        Route("POST", "/generate/", {"prompts": ["hi"]}, True),
    ]  # fmt: skip
    health = ("/health", "/health/")  # the fake server's open paths
    server = Server("fake", url, routes, 64 << 20, health, state=lambda: _get(url, "/health")[1])
    server.extra = _openai_extra(routes[3:5])
    return server


def mcp_server(fleet: Fleet) -> Server:
    module = "atropos.environments.mcp_tools.fixture_server"
    url = fleet.start("mcp", [sys.executable, "-m", module, "--http", "{port}"], "")
    client = {"name": "probe", "version": "1"}
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    routes = [Route("GET", "/mcp"), Route("POST", "/mcp", hello, True), Route("DELETE", "/mcp")]
    accept = {"accept": "application/json, text/event-stream"}
    return Server("mcp", url, routes, 64 << 20, (), accept, extra={"main_writes": ["/mcp"]})


def proxy_server(fleet: Fleet) -> Server:
    fake = fleet.start(
        "proxy-fake", [sys.executable, "-m", "atropos.testing.fake_server", "--port", "{port}"],
        "/health",
    )  # fmt: skip
    argv = [sys.executable, "-m", "atropos", "proxy", "serve", "--port", "{port}"]
    argv += ["--openai.base_url", f"{fake}/v1", "--openai.server_type", "vllm"]
    argv += ["--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny"]
    url = fleet.start("proxy", argv, "/health")
    victim = _post(url, "/sessions", {}).json()
    vkey = {"authorization": f"Bearer {victim['api_key']}"}
    r = _post(url, f"/s/{victim['id']}/v1/chat/completions", CHAT, vkey)
    r.raise_for_status()
    attacker = _post(url, "/sessions", {"limits": {"max_turns": 100_000}}).json()
    akey = {"authorization": f"Bearer {attacker['api_key']}"}
    resp = {"model": "atropos-tiny", "input": "hi", "max_output_tokens": 2}
    msgs = {"model": "atropos-tiny", **CHAT}
    routes = [
        Route("GET", "/health"), Route("GET", "/v1/models"), Route("GET", "/sessions"),
        Route("POST", "/sessions", {"metadata": {"a": 1}}, True),
        Route("POST", "/sessions/create", {}, True),
        *openai_routes("atropos-tiny"),
        Route("POST", "/v1/responses", resp, True, ["max_output_tokens"], BOUNDED_FLOATS),
        Route("POST", "/v1/messages", msgs, True, ["max_tokens"], ["temperature"]),
        Route("GET", f"/sessions/{attacker['id']}/trajectory"),
        Route("POST", f"/sessions/{attacker['id']}/reward", {"reward": 1.0}, True,
              open_floats=["reward"]),
    ]  # fmt: skip
    holder = {"victim": victim}

    def state() -> Any:
        v = holder["victim"]
        code, doc = _get(
            url, f"/sessions/{v['id']}/trajectory", {"authorization": f"Bearer {v['api_key']}"}
        )
        if code != 200:
            return {"victim": code}
        return {"victim": 200, "turns": doc.get("turns"), "reward": doc.get("reward")}

    def restore() -> None:
        v = _post(url, "/sessions", {}).json()
        key = {"authorization": f"Bearer {v['api_key']}"}
        _post(url, f"/s/{v['id']}/v1/chat/completions", CHAT, key)
        holder["victim"] = v

    server = Server("proxy", url, routes, 8 << 20, ("/health",), akey, state, restore)
    server.extra = _openai_extra(routes[5:7]) | {"holder": holder, "attacker": attacker}
    server.extra["main_writes"] = ["/v1/chat/completions", "/sessions"]
    server.extra["chats"] = [*routes[6:7], *routes[7:9]]
    return server


def proxy_new_classes(s: Server) -> dict[str, list[Probe]]:
    attacker = s.extra["attacker"]
    variants = {
        "no key": {},
        "own key, bearer": {"authorization": f"Bearer {attacker['api_key']}"},
        "own key, x-api-key": {"x-api-key": attacker["api_key"]},
    }

    def victim_variants(vid: str) -> dict[str, dict[str, str]]:
        return variants | {"id as bearer": {"authorization": f"Bearer {vid}"}}

    def for_victim() -> list[Probe]:
        vid = s.extra["holder"]["victim"]["id"]
        chat = json.dumps({"model": "atropos-tiny", **CHAT}).encode()
        routes = [
            ("GET", f"/sessions/{vid}/trajectory", None),
            ("POST", f"/sessions/{vid}/reward", b'{"reward": 5.0}'),
            ("GET", f"/s/{vid}/v1/models", None),
            ("POST", f"/s/{vid}/v1/chat/completions", chat),
            (
                "POST",
                f"/s/{vid}/v1/completions",
                b'{"model": "m", "prompt": "hi", "max_tokens": 2}',
            ),
            ("POST", f"/s/{vid}/v1/responses", b'{"model": "m", "input": "hi"}'),
            ("POST", f"/s/{vid}/v1/messages", chat),
            ("DELETE", f"/sessions/{vid}", None),
        ]
        out = [
            Probe("", m, p, h, b, name, bare=True)
            for m, p, b in routes
            for name, h in victim_variants(vid).items()
        ]
        for path in ("/v1/chat/completions", "/v1/responses"):  # /v1/models is open without one
            header = {"x-session-id": vid}
            out.append(Probe("", "POST", path, header, chat, "X-Session-ID, no key", bare=True))
        out += [
            Probe("", "GET", "/sessions", h, None, name, bare=True) for name, h in variants.items()
        ]
        return out

    def upstream() -> list[Probe]:
        vid = s.extra["holder"]["victim"]["id"]
        chat = json.dumps(CHAT).encode()
        out = []
        for uid in (vid, vid.upper(), attacker["id"]):
            for m, p, b in (
                ("POST", f"/{uid}/v1/chat/completions", chat),
                ("GET", f"/{uid}/nodes", None),
                ("DELETE", f"/{uid}", None),
            ):
                for name, h in victim_variants(vid).items():
                    which = (
                        "victim id"
                        if uid == vid
                        else "upper"
                        if uid != attacker["id"]
                        else "own id"
                    )
                    out.append(Probe("", m, p, h, b, f"{name}, uuid={which}", bare=True))
        return out

    return {"another session's id": for_victim(), "upstream uuid = public id": upstream()}


# ----- the report -----------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    keys: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        c = keys.setdefault((r["server"], r["class"]), dict.fromkeys(
            ("requests", "refused", "through", "5xx", "other"), 0))  # fmt: skip
        if r["status"] != "state":
            c["requests"] += 1
        c[r["verdict"]] += 1
    lines = ["| server | class | requests | refused (4xx) | through | 5xx | other |"]
    lines.append("|---|---|---|---|---|---|---|")
    total = dict.fromkeys(("requests", "refused", "through", "5xx", "other"), 0)
    for (server, cls), c in keys.items():
        lines.append(f"| {server} | {cls} | " + " | ".join(str(v) for v in c.values()) + " |")
        for k, v in c.items():
            total[k] += v
    lines.append("| **all** | | " + " | ".join(f"**{v}**" for v in total.values()) + " |")
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["verdict"] in ("through", "5xx"):
            out.append(
                f"{r['server']:9s} {r['class']:30s} {r['status']:6s} {r['method']} {r['path']}"
                f"  [{r['variant']}]"
            )
    return out


SERVERS = ("api", "local", "local-key", "proxy", "mcp", "fake")


def run(only: Iterable[str], tmp: Path, rows: list[dict[str, Any]]) -> None:
    fleet = Fleet(tmp)
    try:
        for name in only:
            print(f"{name}: starting", flush=True)
            if name == "api":
                s = api_server(fleet)
                classes = old_classes(s)
            elif name in ("local", "local-key"):
                keyed = name == "local-key"
                s = local_server(fleet, keyed)
                classes = local_new_classes(s, keyed) if keyed else old_classes(s)
                if not keyed:
                    classes |= local_new_classes(s, keyed)
            elif name == "proxy":
                s = proxy_server(fleet)
                classes = old_classes(s) | proxy_new_classes(s)
            elif name == "mcp":
                s = mcp_server(fleet)
                classes = old_classes(s)
            else:
                s = fake_server(fleet)
                classes = old_classes(s)
            probe_server(s, classes, rows)
            fleet.stop()
            fleet.services.clear()
    finally:
        fleet.stop()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", help=f"comma-separated servers of {', '.join(SERVERS)}")
    p.add_argument("--json", type=Path, help="write every request's row here")
    p.add_argument("--logs", type=Path, help="keep the servers' logs in this new directory")
    args = p.parse_args(argv)
    only = args.only.split(",") if args.only else list(SERVERS)
    unknown = set(only) - set(SERVERS)
    if unknown:
        p.error(f"unknown servers: {sorted(unknown)}")
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile_probe_") as tmp, sigterm_as_interrupt():
        work = Path(tmp)
        if args.logs:  # the servers' logs (and work dirs) kept there
            work = args.logs.resolve()
            work.mkdir(parents=True, exist_ok=False)
        try:
            run(only, work, rows)
        except KeyboardInterrupt:
            print("interrupted: every server stopped; partial results below", flush=True)
    print(f"\n{len(rows)} rows in {time.monotonic() - started:.0f} s\n")
    print(table(rows))
    bad = failures(rows)
    if bad:
        print(f"\n{len(bad)} through or 5xx:")
        print("\n".join(bad))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"code": code_version(), "servers": only, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
