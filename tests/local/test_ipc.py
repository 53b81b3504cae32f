"""`--transfer-backend ipc`: weights by CUDA IPC handles from a trainer sharing the server's GPU.

On any machine: the restricted unpickler (`atropos.local.ipc.read_handles`) takes what a CUDA
tensor's handle holds and refuses anything else, and each end refuses IPC where it cannot work,
with the reason. On a machine with a GPU: the trainer's client pushes into a server subprocess
on the same GPU, under a request in flight (`keep`), the served weights then equal the trainer's.
"""

from __future__ import annotations

import base64
import concurrent.futures
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from atropos.local.ipc import IpcError, read_handles
from atropos.local.weights import load_fp32, weights_checksum
from atropos.trainer.transfer import SyncError, TransferClient

from .test_transfer import LONG, Server, serve_subprocess

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")


def _pickled(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode()


def test_the_unpickler_reads_a_cuda_handle_and_nothing_else() -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = (
        torch.Tensor, torch.Size([2, 3]), (3, 1), 0, torch.storage.UntypedStorage,
        torch.bfloat16, 0, b"handle", 12, 0, False, b"counter", 0, b"event", True,
    )  # fmt: skip
    [handle] = read_handles(_pickled([{"GPU-1": (rebuild_cuda_tensor, args)}]))
    assert handle["GPU-1"][0] is rebuild_cuda_tensor and handle["GPU-1"][1] == args
    for bad, reason in [
        (_pickled([{"GPU-1": (subprocess.run, (["true"],))}]), "subprocess.run is not part"),
        (_pickled([{"GPU-1": (torch.load, ("x",))}]), "torch.serialization.load is not part"),
        (_pickled({"GPU-1": 1}), "must hold a list"),
        ("not base64!", "is not base64"),
        (base64.b64encode(b"\x80\x05junk").decode(), "cannot be read"),
        ("", "non-empty base64 string"),
    ]:
        with pytest.raises(IpcError, match=reason):
            read_handles(bad)


def test_ipc_is_refused_where_it_cannot_work(start_server: Any, model_dir: Path) -> None:
    class OnGpu:  # a model whose parameters say cuda, enough to reach the server-type check
        def parameters(self) -> Iterator[Any]:
            yield SimpleNamespace(device=torch.device("cuda", 0))

    with httpx.Client() as http:
        cpu_model = load_fp32(str(model_dir))
        with pytest.raises(SyncError, match="model is on cpu; use gloo"):
            TransferClient(["http://127.0.0.1:9"], http, backend="ipc").connect(cpu_model)
        sglang = TransferClient(["http://127.0.0.1:9"], http, backend="ipc", server_type="sglang")
        with pytest.raises(SyncError, match="speaks vLLM's routes"):
            sglang.connect(OnGpu())
    with start_server(model_dir) as live:  # a gloo server: an IPC trainer's empty init_info
        refused = live.post("/init_weight_transfer_engine", {"init_info": {}})
        assert refused.status_code == 400 and "--transfer-backend ipc" in refused.text
    from atropos.local.transfer import TransferReceiver

    with start_server(model_dir) as live:  # an ipc server whose model is on the CPU
        receiver = TransferReceiver(live.engine, backend="ipc")
        with pytest.raises(Exception, match="needs the served model on a GPU; it is on cpu"):
            receiver.init({}, None, None)


@pytest.fixture(scope="module")
def gpu_server(model_dir: Path) -> Iterator[Server]:
    with serve_subprocess(model_dir, "--device", "cuda", "--transfer-backend", "ipc") as live:
        yield live


@needs_gpu
def test_ipc_pushes_the_trainers_gpu_weights_under_a_request_in_flight(
    gpu_server: Server, model_dir: Path
) -> None:
    model = load_fp32(str(model_dir)).to("cuda")
    client = TransferClient([gpu_server.root], httpx.Client(), backend="ipc", timeout=60)
    client.connect(model)
    before = gpu_server.version()
    greedy = gpu_server.http.post("/v1/completions", json=LONG).json()["choices"][0]["token_ids"]
    try:
        for step in (1, 2):
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.3)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                answer = gpu_server.hold_in_flight(pool)
                assert client.push(model, before + step) == before + step
                body = answer.result(60).json()
            assert (body["policy_version"], body["policy_version_last"]) == (
                before + step - 1,
                before + step,
            )
            assert gpu_server.checksum() == weights_checksum(model.state_dict())
        assert body["choices"][0]["token_ids"] != greedy
    finally:
        client.close()
