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

from atropos.client.transfer import SyncError, TransferClient
from atropos.local.ipc import IpcError, read_handles
from atropos.local.weights import load_fp32, weights_checksum

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


def _handle_args() -> tuple[Any, ...]:
    return (
        torch.Tensor, torch.Size([2, 3]), (3, 1), 0, torch.storage.TypedStorage,
        torch.float32, 0, b"h" * 64, 2**40, 0, False, b"r" * 20, 0, b"", True,
    )  # fmt: skip


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, ("touch pwned",))


def test_the_opcode_walk_passes_a_handle_in_every_protocol() -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    handles = [{"GPU-1": (rebuild_cuda_tensor, _handle_args())}] * 2  # memo references too
    for protocol in range(3, pickle.HIGHEST_PROTOCOL + 1):  # 2 spells bytes by a call
        raw = base64.b64encode(pickle.dumps(handles, protocol=protocol)).decode()
        assert read_handles(raw)[1]["GPU-1"][1] == _handle_args()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        # BUILD on an allowed class: __setstate__ / setattr with the attacker's dict
        (b"\x80\x04ctorch\nTensor\n}\x8c\x01a\x8c\x01bsb.", "opcode BUILD"),
        (b"\x80\x04ctorch\nSize\n)\x81}b.", "opcode NEWOBJ"),  # NEWOBJ, then BUILD
        (pickle.dumps(_Evil(), protocol=4), "posix.system is not part"),  # REDUCE of os.system
        (b"(Vtouch pwned\nios\nsystem\n.", "opcode INST"),
        (b"(ctorch\nTensor\nVx\no.", "opcode OBJ"),
        # a nested global: an attribute path below an allowed name
        (b"\x80\x04\x8c\x05torch\x8c\x0fTensor.__init__\x93.", "torch.Tensor.__init__"),
        (b"\x80\x04\x8c\x05torch\x8c\x0bfloat32.foo\x93.", "torch.float32.foo"),
        (b"\x80\x04ctorch\nTensor\n)R.", "a call of torch.Tensor"),  # REDUCE of a non-Size
        (b"\x80\x04\x82\x01.", "opcode EXT1"),
        (b"\x80\x04\x8c\x01xQ.", "opcode BINPERSID"),
        (b"\x80\x04N\x94N\x93.", "two strings"),  # a global named by non-strings
        (b"\x80\x04h\x07.", "cannot be read"),  # a memo slot never written
    ],
)
def test_crafted_pickles_are_refused_before_anything_runs(
    raw: bytes, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IpcError, match=reason):
        read_handles(base64.b64encode(raw).decode())
    assert not (tmp_path / "pwned").exists()


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
