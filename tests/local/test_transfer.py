"""In-flight weight updates into `atropos local serve` over a gloo group (vLLM's and SGLang's
routes), driven by the trainer's own client (`atropos.client.transfer.TransferClient`).

The server runs as a subprocess on 127.0.0.1 (a process holds a group by name, so the trainer's
end lives in this one); one server serves the module, each test opens a group of its own. A
request is known to be in flight once a `keep` pause reports it (`num_paused_requests`), so no
test depends on timing; "the weights equal the trainer's" is `GET /weights_checksum` against
`weights_checksum` of the trainer's state dict.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.client.transfer import SyncError, TransferClient
from atropos.demo.procs import wait_until_up
from atropos.local.weights import load_fp32, weights_checksum
from atropos.testing import free_port

PROMPT = [5, 17, 42, 7]
LONG = {
    "prompt": PROMPT,
    "max_tokens": 200,
    "temperature": 0,
    "ignore_eos": True,
    "return_token_ids": True,
}
SEEDS = itertools.count(1)


class Server:
    """The subprocess server: its root URL and an HTTP client."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.http = httpx.Client(base_url=root, timeout=60)

    def version(self) -> int:
        body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        return int(self.http.post("/v1/completions", json=body).json()["policy_version"])

    def checksum(self) -> str:
        return str(self.http.get("/weights_checksum").json()["sha256"])

    def hold_in_flight(self, pool: concurrent.futures.Executor) -> concurrent.futures.Future[Any]:
        """Start a long request and return once it is parked mid-generation by a keep pause
        (a request that ends before a pause catches it is replaced by a new one)."""
        answer = pool.submit(self.http.post, "/v1/completions", json=LONG)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            paused = self.http.post("/pause", params={"mode": "keep"}).json()
            if paused["num_paused_requests"] == 1:
                return answer
            self.http.post("/resume")
            if answer.done():
                answer = pool.submit(self.http.post, "/v1/completions", json=LONG)
            time.sleep(0.002)
        raise AssertionError("no long request was caught in flight within 30 s")


@contextlib.contextmanager
def serve_subprocess(model_dir: Path, *flags: str, timeout: float = 60) -> Iterator[Server]:
    """`atropos local serve MODEL_DIR FLAGS` in a subprocess on a free port, stopped by its pid."""
    port = free_port()
    argv = [sys.executable, "-m", "atropos", "local", "serve", str(model_dir), "--port", str(port)]
    proc = subprocess.Popen([*argv, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", timeout)
        live = Server(f"http://127.0.0.1:{port}")
        yield live
        live.http.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Server]:
    with serve_subprocess(model_dir) as live:
        yield live


@pytest.fixture
def trainer_model(model_dir: Path) -> Any:
    """The trainer's weights: the served model's architecture, other values in every test."""
    import torch

    model = load_fp32(str(model_dir))
    generator = torch.Generator().manual_seed(next(SEEDS))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


def connect(server: Server, model: Any, **options: Any) -> TransferClient:
    client = TransferClient([server.root], httpx.Client(), timeout=60, **options)
    client.connect(model)
    return client


@pytest.mark.parametrize("server_type", ["vllm", "sglang"])
def test_keep_mode_swaps_the_weights_under_a_request_in_flight(
    server: Server, trainer_model: Any, pool: Any, server_type: str
) -> None:
    before = server.version()
    greedy = server.http.post("/v1/completions", json=LONG).json()["choices"][0]["token_ids"]
    client = connect(server, trainer_model, server_type=server_type, pause="keep")
    try:
        answer = server.hold_in_flight(pool)
        assert client.push(trainer_model, before + 1) == before + 1
        body = answer.result(60).json()
    finally:
        client.close()
    assert (body["policy_version"], body["policy_version_last"]) == (before, before + 1)
    ids = body["choices"][0]["token_ids"]
    assert ids[0] == greedy[0] and ids != greedy  # begun under the old weights, ended under new
    assert server.version() == before + 1
    assert server.checksum() == weights_checksum(trainer_model.state_dict())


def test_abort_mode_fails_the_request_in_flight_with_a_retryable_error(
    server: Server, trainer_model: Any, pool: Any
) -> None:
    before = server.version()
    client = connect(server, trainer_model, pause="abort")
    try:
        answer = server.hold_in_flight(pool)
        client.push(trainer_model, before + 1)
        failed = answer.result(60)
    finally:
        client.close()
    assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
    assert "aborted" in failed.json()["error"]["message"]
    assert server.version() == before + 1
    assert server.checksum() == weights_checksum(trainer_model.state_dict())


def test_wait_mode_lets_the_request_in_flight_finish_first(
    server: Server, trainer_model: Any, pool: Any
) -> None:
    before = server.version()
    client = connect(server, trainer_model, pause="wait")
    try:
        answer = server.hold_in_flight(pool)
        client.push(trainer_model, before + 1)
        assert answer.done()  # the update waited for it
        body = answer.result().json()
    finally:
        client.close()
    assert (body["policy_version"], body["policy_version_last"]) == (before, before)
    assert server.version() == before + 1
    assert server.checksum() == weights_checksum(trainer_model.state_dict())


def test_a_refused_update_is_a_sync_error_at_once_and_the_server_goes_on(
    server: Server, trainer_model: Any, model_dir: Path
) -> None:
    import torch

    client = connect(server, trainer_model)
    try:
        refused = server.http.post("/update_weights", json={"update_info": {}})
        assert refused.status_code == 400 and "names must be a list" in refused.text
        info = {"names": ["nope"], "dtype_names": ["float32"], "shapes": [[1]]}
        refused = server.http.post("/update_weights", json={"update_info": info})
        assert refused.status_code == 400 and "no tensor 'nope'" in refused.text
        assert server.http.get("/is_paused").json() == {"is_paused": False}
        wrong = load_fp32(str(model_dir))
        wrong.lm_head.weight = torch.nn.Parameter(torch.zeros(3, 3))  # untied, another shape
        t0 = time.monotonic()
        with pytest.raises(SyncError, match="lm_head.weight: shape"):
            client.push(wrong, 99)
        assert time.monotonic() - t0 < 10  # refused, not timed out
    finally:
        client.close()
    assert server.http.post("/resume").status_code == 200  # nothing was written
    assert server.version() != 99
    bad = server.http.post("/pause", params={"mode": "later"})
    assert bad.status_code == 400 and "mode must be one of abort, wait, keep" in bad.text


def test_sglang_sessions_and_a_refused_push_leave_the_server_generating(
    server: Server, trainer_model: Any, model_dir: Path
) -> None:
    """SGLang 0.5.23's begin/end: one session at a time, no end without a begin. A push whose
    update is refused ends its session and lifts its pause (the trainer's `try/finally`)."""
    import torch

    refused = server.http.post("/end_weight_update", json={})
    assert refused.status_code == 400 and "no weight-update session" in refused.text
    assert server.http.post("/begin_weight_update", json={"selector": "all"}).status_code == 200
    again = server.http.post("/begin_weight_update", json={})
    assert again.status_code == 400 and "already open" in again.text
    assert server.http.post("/end_weight_update").status_code == 200
    client = connect(server, trainer_model, server_type="sglang", pause="keep")
    try:
        wrong = load_fp32(str(model_dir))
        wrong.lm_head.weight = torch.nn.Parameter(torch.zeros(3, 3))  # untied, another shape
        with pytest.raises(SyncError, match="lm_head.weight: shape"):
            client.push(wrong, 99)
    finally:
        client.close()
    assert server.http.get("/is_paused").json() == {"is_paused": False}
    assert server.http.post("/begin_weight_update", json={}).status_code == 200  # it was ended
    assert server.http.post("/end_weight_update", json={}).status_code == 200
    assert server.version() != 99


def test_updates_need_a_group_first(start_server: Any, model_dir: Path) -> None:
    with start_server(model_dir) as live:
        info = {"names": [], "dtype_names": [], "shapes": []}
        refused = live.post("/update_weights", {"update_info": info})
        assert refused.status_code == 400 and "call the init route first" in refused.text
        refused = live.post("/finish_weight_update", {})
        assert refused.status_code == 400 and "no update started" in refused.text
        assert live.get("/get_world_size").json() == {"world_size": 1}


def test_the_engine_pauses_parks_and_resumes_in_process(model_dir: Path) -> None:
    """The engine alone: a pause on an idle engine holds new requests until resume; a swap
    needs a pause; closing the engine ends a parked batch at once."""
    from atropos.local.engine import Engine
    from atropos.local.protocol import Aborted, Sampling

    engine = Engine(str(model_dir), device="cpu").start()
    try:
        with pytest.raises(RuntimeError, match="needs a paused engine"):
            engine.swap_weights(lambda model: None)
        assert engine.pause("keep") == 0
        held = engine.submit([PROMPT], Sampling(max_tokens=2, temperature=0))
        time.sleep(0.2)
        assert not held.done()  # waits for resume
        assert engine.swap_weights(lambda model: "written") == "written"
        engine.resume()
        assert held.result(30).policy_version == 0
        long = engine.submit([PROMPT], Sampling(max_tokens=200, temperature=0, ignore_eos=True))
        deadline = time.monotonic() + 30
        while engine.pause("keep") != 1:
            engine.resume()
            if long.done():
                long = engine.submit([PROMPT], Sampling(max_tokens=200, ignore_eos=True))
            assert time.monotonic() < deadline
    finally:
        t0 = time.monotonic()
        engine.close()
    assert time.monotonic() - t0 < 10
    with pytest.raises(Aborted):
        long.result(10)
