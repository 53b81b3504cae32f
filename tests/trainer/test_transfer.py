"""`atropos train --sync transfer` end to end: the trainer pushes each step's weights into a
local server (a subprocess on 127.0.0.1) over a gloo group, in vLLM's and SGLang's dialects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_real_vllm_server_is_refused_at_once_with_the_reason() -> None:
    """vLLM's NCCL engine joins through its own process-group code, which a torch.distributed
    group cannot meet: the trainer says so before any rendezvous instead of timing out."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from atropos.trainer.transfer import SyncError, TransferClient

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})

    app = Starlette(routes=[Route("/v1/models", models)])
    with serve_in_thread(app) as url, httpx.Client() as http:
        client = TransferClient([url], http, timeout=5)
        with pytest.raises(
            SyncError, match="is a vLLM server: .* --transfer-backend ipc .* --sync reload"
        ):
            client.connect(_Model())


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

    from atropos.trainer.transfer import SyncError

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
