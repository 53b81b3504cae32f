"""network="model-only": the sandbox reaches the model's URL (streamed responses arrive in
pieces) and nothing else (another host port, an outside address, DNS); "none" still reaches
nothing; the relay ends with the sandbox, and with its owner's SIGKILL then sweep."""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox.conftest import leftovers

from atropos.sandbox import SandboxSpec, _host, open_sandbox, sweep
from atropos.sandbox.spec import model_target

PROVIDERS = ["bubblewrap", "process"]
needs_root = pytest.mark.skipif(not _host.IS_ROOT, reason="model-only needs root")


class Model(http.server.BaseHTTPRequestHandler):
    """A fake model endpoint: /v1/hello answers at once; /v1/stream sends one event, then
    the second only after /v1/release was asked (so a relay that held the response back
    until its end would never deliver the first)."""

    protocol_version = "HTTP/1.1"
    released: threading.Event

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/v1/hello":
            self._send(b"hello from the model")
        elif self.path == "/v1/release":
            self.released.set()
            self._send(b"released")
        elif self.path == "/v1/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"data: one\n\n")
            self.released.wait(30)
            self._chunk(b"data: two\n\n")
            self._chunk(b"")
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def model() -> Iterator[int]:
    """The fake model's port on the host's 127.0.0.1."""
    handler = type("Handler", (Model,), {"released": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    handler.released.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def forbidden() -> Iterator[socket.socket]:
    """Another server on the host's 127.0.0.1 the sandbox must not reach."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    yield server
    server.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def spec_for(port: int) -> SandboxSpec:
    return SandboxSpec(network="model-only", model_url=f"http://127.0.0.1:{port}/v1")


REACH = """
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), 5).close()
    print("reached")
except OSError as error:
    print(errno.errorcode.get(error.errno, error.errno))
"""

DNS = """
import socket
try:
    print(socket.getaddrinfo("example.com", 80))
except OSError as error:
    print("no dns", type(error).__name__)
"""

STREAM = """
import http.client, os, urllib.parse, urllib.request
base = os.environ["ATROPOS_MODEL_URL"]
url = urllib.parse.urlsplit(base)
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
connection.request("GET", url.path + "/stream")
response = connection.getresponse()
print("first", response.readline())
print(urllib.request.urlopen(base + "/release", timeout=20).read())
print("rest", response.read())
"""


def test_spec_validation() -> None:
    assert model_target("http://127.0.0.1:8000/v1/") == ("127.0.0.1", 8000, "/v1")
    assert model_target("http://proxy.internal:9000") == ("proxy.internal", 9000, "")
    assert model_target("http://[::1]:8000") == ("::1", 8000, "")
    assert model_target("http://localhost") == ("localhost", 80, "")
    with pytest.raises(ValueError, match="needs model_url"):
        SandboxSpec(network="model-only")
    with pytest.raises(ValueError, match="only used with network='model-only'"):
        SandboxSpec(model_url="http://127.0.0.1:8000")
    bad = {
        "https://127.0.0.1:8000": "must be http://",
        "127.0.0.1:8000": "must be http://",
        "http:///v1": "names no host",
        "http://127.0.0.1:0/v1": "port 0",
        "http://127.0.0.1:99999": "is not a URL",
        "http://user:key@127.0.0.1:8000": "credentials",
        "http://127.0.0.1:8000/v1?x=1": "query",
    }
    for url, why in bad.items():
        with pytest.raises(ValueError, match=why):
            SandboxSpec(network="model-only", model_url=url)


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_model_only_reaches_the_model_and_nothing_else(
    provider: str, run_root: Path, model: int, forbidden: socket.socket
) -> None:
    other = forbidden.getsockname()[1]

    async def scenario() -> list[Any]:
        async with await open_sandbox(spec_for(model), provider) as box:
            assert box.model_url == f"http://127.0.0.1:{model}/v1"
            await box.put("reach.py", REACH.encode())
            return [
                await box.exec('curl -sS --max-time 20 "$ATROPOS_MODEL_URL/hello"', timeout=30),
                await box.exec(f"curl -sS --max-time 5 http://127.0.0.1:{other}/", timeout=30),
                await box.exec(["python3", "reach.py", "127.0.0.1", str(other)], timeout=30),
                # no route: the connect fails in the kernel, nothing is ever sent
                await box.exec(["python3", "reach.py", "1.1.1.1", "80"], timeout=30),
                await box.exec(["python3", "-c", DNS], timeout=30),
                await box.exec("cat /sys/class/net/*/operstate; ls /sys/class/net", timeout=30),
            ]

    model_answer, curl_other, other_port, outside, dns, interfaces = run(scenario())
    assert model_answer.ok and model_answer.stdout == b"hello from the model", model_answer
    assert curl_other.exit_code == 7, curl_other  # curl: could not connect
    assert other_port.stdout.strip() == b"ECONNREFUSED", other_port  # its own lo: nothing there
    with pytest.raises(BlockingIOError):
        forbidden.accept()  # nothing ever reached the host's other port
    assert outside.stdout.strip() == b"ENETUNREACH", outside
    assert dns.stdout.startswith(b"no dns"), dns
    if provider == "process":  # bubblewrap's /sys is not mounted
        assert interfaces.stdout.split()[-1:] == [b"lo"], interfaces
    assert leftovers(run_root) == []


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_streamed_response_arrives_in_pieces(provider: str, run_root: Path, model: int) -> None:
    async def scenario() -> Any:
        async with await open_sandbox(spec_for(model), provider) as box:
            return await box.exec(["python3", "-c", STREAM], timeout=60)

    result = run(scenario())
    # the first event came before the second existed: it was relayed as it came
    assert result.ok, result
    assert result.stdout.splitlines() == [
        b"first b'data: one\\n'",
        b"b'released'",
        b"rest b'\\ndata: two\\n\\n'",
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_none_still_reaches_nothing(provider: str, run_root: Path, model: int) -> None:
    async def scenario() -> Any:
        async with await open_sandbox(SandboxSpec(), provider) as box:
            assert box.model_url is None
            await box.put("reach.py", REACH.encode())
            return await box.exec(
                f'echo "[$ATROPOS_MODEL_URL]"; python3 reach.py 127.0.0.1 {model}', timeout=30
            )

    result = run(scenario())
    assert result.stdout.split()[0] == b"[]", result
    assert result.stdout.split()[1] in (b"ECONNREFUSED", b"ENETUNREACH"), result


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_close_leaves_no_relay(provider: str, run_root: Path, model: int) -> None:
    async def scenario() -> tuple[int, int]:
        box = await open_sandbox(spec_for(model), provider)
        assert box.relay is not None and box.uid is not None
        pid, uid = box.relay.proc.pid, box.uid
        assert _host.tasks_of(uid) == [pid]  # the relay runs as the sandbox's uid
        await box.close()
        return pid, uid

    pid, uid = run(scenario())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    assert leftovers(run_root, [uid]) == []


OWNER = """
import asyncio, sys
from atropos.sandbox import SandboxSpec, open_sandbox

async def main():
    spec = SandboxSpec(network="model-only", model_url=sys.argv[1])
    boxes = [await open_sandbox(spec, p) for p in ("bubblewrap", "process")]
    print(" ".join(f"{box.uid}:{box.relay.proc.pid}" for box in boxes), flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


@needs_root
def test_sigkill_of_the_owner_ends_the_relays_and_sweep_leaves_nothing(
    run_root: Path, model: int
) -> None:
    url = f"http://127.0.0.1:{model}/v1"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, url], stdout=subprocess.PIPE, env={**os.environ}, text=True
    )
    assert owner.stdout is not None
    pairs = [pair.split(":") for pair in owner.stdout.readline().split()]
    uids, relays = [int(uid) for uid, _ in pairs], [int(pid) for _, pid in pairs]
    assert len(relays) == 2 and all(_host.tasks_of(uid) for uid in uids)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    while any(_host.tasks_of(uid) for uid in uids) and time.monotonic() < deadline:
        time.sleep(0.02)
    # the relays read EOF on the pipe only their owner held, and exited
    assert [_host.tasks_of(uid) for uid in uids] == [[], []]
    assert sweep(run_root) == 2
    assert leftovers(run_root, uids) == []
