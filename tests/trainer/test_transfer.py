"""`atropos train --sync transfer` end to end: the trainer pushes each step's weights into a
local server (a subprocess on 127.0.0.1) over a gloo group, in vLLM's and SGLang's dialects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.demo.procs import wait_until_up  # noqa: E402
from atropos.local.weights import load_fp32, weights_checksum  # noqa: E402
from atropos.testing import free_port, serve_in_thread  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402


@pytest.mark.parametrize(("server_type", "pause"), [("vllm", "keep"), ("sglang", "wait")])
def test_transfer_mode_pushes_each_step_into_the_running_server(
    tiny_model_dir: Path, tmp_path: Path, server_type: str, pause: str
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "atropos", "local", "serve", str(tiny_model_dir)]
    server = subprocess.Popen([*argv, "--port", str(port)], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/health", 60)
        with serve_in_thread(create_app()) as url:
            push_groups(url, 4)
            out = tmp_path / "run"
            cfg = config(
                tiny_model_dir, url, out, steps=2, sync="transfer", server_url=f"{base}/v1",
                server_type=server_type, transfer_pause=pause,
            )  # fmt: skip
            train(cfg)
        assert [m["served_policy_version"] for m in metrics(out)] == [1, 2]
        assert not (out / "weights").exists()  # nothing went through the disk
        body = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=30).json()
        assert (answer["policy_version"], answer["policy_version_last"]) == (2, 2)
        trained = load_fp32(str(out / "checkpoints" / "step_2"))
        served = httpx.get(f"{base}/weights_checksum", timeout=30).json()["sha256"]
        assert served == weights_checksum(trained.state_dict())
    finally:
        server.terminate()
        server.wait(30)


def _fake_vllm(calls: list[tuple[str, Any]]) -> Any:
    """A stand-in for vLLM's HTTP side: its model card says `owned_by: vllm`; every
    weight-transfer route records its body."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})

    async def world(request: Request) -> JSONResponse:
        return JSONResponse({"world_size": 2})

    async def record(request: Request) -> JSONResponse:
        raw = await request.body()
        calls.append((request.url.path, json.loads(raw) if raw else dict(request.query_params)))
        return JSONResponse({})

    paths = ["/init_weight_transfer_engine", "/pause", "/start_weight_update", "/update_weights"]
    paths += ["/finish_weight_update", "/resume"]
    routes = [Route("/v1/models", models), Route("/get_world_size", world)]
    return Starlette(routes=routes + [Route(p, record, methods=["POST"]) for p in paths])


def test_a_vllm_server_gets_the_nccl_unique_id_and_the_tensors_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's engine joins by the NCCL unique id the trainer mints (`nccl_unique_id_b64`, no
    master address), then each sync is pause, start, update (names, dtypes, shapes; the
    tensors broadcast meanwhile, in that order), finish, resume. NCCL itself needs GPUs: the
    group is a stand-in here; a model on the CPU is refused with the reason."""
    import base64

    import torch

    from atropos.client.transfer import SyncError, TransferClient
    from atropos.local import group as groups

    sent: list[Any] = []

    class FakeGroup:
        def send(self, tensor: Any) -> None:
            sent.append(tensor)

        def close(self) -> None:
            pass

    class FakeOpener:
        def __init__(self, world_size: int, timeout: float) -> None:
            assert world_size == 3  # the trainer and two workers

        def open(self) -> bytes:
            return bytes(range(128))

        def joined(self) -> FakeGroup:
            return FakeGroup()

    class OnGpu(_Model):
        def parameters(self):  # type: ignore[no-untyped-def]
            yield SimpleNamespace(device=torch.device("cuda", 0))

    monkeypatch.setattr(groups, "UniqueIdGroup", FakeOpener)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    calls: list[tuple[str, Any]] = []
    with serve_in_thread(_fake_vllm(calls)) as url, httpx.Client() as http:
        with pytest.raises(SyncError, match="over NCCL from a trainer on a GPU .* ipc"):
            TransferClient([url], http, timeout=5).connect(_Model())
        client = TransferClient([url], http, timeout=5, pause="wait")
        client.connect(OnGpu())
        model = torch.nn.Linear(2, 3)
        assert client.push(model, 7) is None
    names = [path for path, _ in calls]
    assert names == [
        "/init_weight_transfer_engine", "/pause", "/start_weight_update", "/update_weights",
        "/finish_weight_update", "/resume",
    ]  # fmt: skip
    info = calls[0][1]["init_info"]
    assert info == {
        "nccl_unique_id_b64": base64.b64encode(bytes(range(128))).decode(),
        "rank_offset": 1, "world_size": 3, "packed": False,
    }  # fmt: skip
    assert calls[1][1] == {"mode": "wait"}
    update = calls[3][1]["update_info"]
    assert update == {
        "names": ["weight", "bias"], "dtype_names": ["float32", "float32"],
        "shapes": [[3, 2], [3]],
    }  # fmt: skip
    assert [t.shape for t in sent] == [torch.Size([3, 2]), torch.Size([3])]
    assert calls[4][1] == {"policy_version": 7}


def _fake_sglang(calls: list[tuple[str, Any]], *, sessions: bool, refuse: str = "") -> Any:
    """A stand-in for SGLang's HTTP side that records each weight-update call: with `sessions`
    (0.5.23) the update is refused outside begin/end, as SGLang refuses it; without, the begin
    and end routes answer 404, as in older SGLang. The route named `refuse` answers 400."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state = {"session": False}

    async def record(request: Request) -> JSONResponse:
        raw = await request.body()
        path = request.url.path
        calls.append((path, json.loads(raw) if raw else None))
        if path == refuse:
            return JSONResponse({"success": False, "message": "refused"}, status_code=400)
        if path == "/update_weights_from_distributed" and sessions and not state["session"]:
            message = "must run between begin_weight_update() and end_weight_update()"
            return JSONResponse({"success": False, "message": message}, status_code=400)
        if path in ("/begin_weight_update", "/end_weight_update"):
            if not sessions:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            state["session"] = path == "/begin_weight_update"
        return JSONResponse({"success": True, "message": "Success"})

    paths = ["/pause_generation", "/update_weights_from_distributed", "/continue_generation"]
    paths += ["/begin_weight_update", "/end_weight_update"]
    return Starlette(routes=[Route(p, record, methods=["POST"]) for p in paths])


class _SentGroup:
    """A group that keeps what is broadcast (the fake servers join none)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, tensor: Any) -> None:
        self.sent.append(tensor)

    def close(self) -> None:
        pass


def _sglang_client(url: str, http: httpx.Client, pause: str) -> Any:
    from atropos.client.transfer import TransferClient

    client = TransferClient([url], http, server_type="sglang", pause=pause, timeout=5)
    client.group, client.group_name = _SentGroup(), "g"  # as connect() leaves them
    return client


def test_sglang_updates_inside_a_weight_update_session() -> None:
    """SGLang 0.5.23 takes `update_weights_from_distributed` only between `begin_weight_update`
    and `end_weight_update`: each push is pause, begin, update (the tensors broadcast
    meanwhile), end, continue; `wait` sends no pause (the update waits)."""
    import torch

    calls: list[tuple[str, Any]] = []
    model = torch.nn.Linear(2, 3)
    with serve_in_thread(_fake_sglang(calls, sessions=True)) as url, httpx.Client() as http:
        client = _sglang_client(url, http, "keep")
        assert client.push(model, 7) is None  # SGLang's answers carry no version
        client.pause = "wait"
        client.push(model, 8)
    assert [path for path, _ in calls] == [
        "/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
        "/end_weight_update", "/continue_generation",
        "/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update",
    ]  # fmt: skip
    assert calls[0][1] == {"mode": "retract"}  # keep: recomputed under the new weights
    assert calls[1][1] == {"selector": "all"} and calls[3][1] == {}
    assert calls[2][1] == {
        "names": ["weight", "bias"], "dtypes": ["float32", "float32"], "shapes": [[3, 2], [3]],
        "group_name": "g", "flush_cache": True, "weight_version": "7",
    }  # fmt: skip
    assert [list(t.shape) for t in client.group.sent] == [[3, 2], [3]] * 2


def test_an_older_sglang_without_sessions_gets_the_update_alone() -> None:
    """A 404 to `begin_weight_update` (SGLang before sessions): the update is sent without one,
    and that server is not asked to begin again."""
    import torch

    calls: list[tuple[str, Any]] = []
    model = torch.nn.Linear(2, 3)
    with serve_in_thread(_fake_sglang(calls, sessions=False)) as url, httpx.Client() as http:
        client = _sglang_client(url, http, "abort")
        client.push(model, 1)
        client.push(model, 2)
    assert [path for path, _ in calls] == [
        "/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
        "/continue_generation",
        "/pause_generation", "/update_weights_from_distributed", "/continue_generation",
    ]  # fmt: skip
    assert calls[0][1] == {"mode": "abort"} and calls[5][1]["weight_version"] == "2"


@pytest.mark.parametrize(
    "refuse",
    [
        "/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
        "/end_weight_update",
    ],
)  # fmt: skip
def test_a_failed_sglang_push_still_ends_the_session_and_resumes(refuse: str) -> None:
    """Whichever step SGLang refuses (the pause too), the push raises it, and no server is left
    paused
    (SGLang's /health would hang) nor inside a session (the next begin would be refused)."""
    import torch

    from atropos.client.transfer import SyncError

    calls: list[tuple[str, Any]] = []
    app = _fake_sglang(calls, sessions=True, refuse=refuse)
    with serve_in_thread(app) as url, httpx.Client() as http:
        client = _sglang_client(url, http, "keep")
        with pytest.raises(SyncError, match=f"{refuse}: 400"):
            client.push(torch.nn.Linear(2, 3), 3)
    paths = [path for path, _ in calls]
    assert paths[0] == "/pause_generation" and paths[-1] == "/continue_generation"
    began = "/update_weights_from_distributed" in paths
    assert paths.count("/end_weight_update") == int(began)  # not after a refused begin


class _Model:
    """Just enough of a model for `connect` to pick a backend."""

    def parameters(self):  # type: ignore[no-untyped-def]
        import torch

        yield torch.zeros(1)


def test_transfer_timeout_bounds_a_server_that_never_joins(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`--transfer-timeout`: a server that accepts the init route but never joins the group
    ends the trainer's start within that many seconds, naming the wait."""
    import asyncio
    import time

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from atropos.client.transfer import SyncError

    async def world(request: Request) -> JSONResponse:
        return JSONResponse({"world_size": 1})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": []})

    async def never(request: Request) -> JSONResponse:
        await asyncio.sleep(4)  # past the deadline; short, as the server's exit waits for it
        return JSONResponse({})

    routes = [
        Route("/get_world_size", world),
        Route("/v1/models", models),
        Route("/init_weight_transfer_engine", never, methods=["POST"]),
    ]
    with serve_in_thread(Starlette(routes=routes)) as server, serve_in_thread(create_app()) as url:
        cfg = config(
            tiny_model_dir, url, tmp_path / "run", steps=1, sync="transfer",
            server_url=f"{server}/v1", transfer_timeout=2,
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(SyncError, match=r"within 2 s \(--transfer-timeout\)"):
            train(cfg)
        assert time.monotonic() - started < 20
