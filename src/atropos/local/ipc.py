"""CUDA IPC weight transfer: a trainer and a server sharing one GPU, the weights never copied
off it (vLLM's ``ipc`` weight-transfer backend, also `atropos local serve --transfer-backend ipc`).

The trainer exports each tensor as a CUDA IPC handle (`torch.multiprocessing.reductions.
reduce_tensor`: the rebuild function and its arguments), keyed by the physical GPU's UUID as
NVML writes it (``GPU-...``), and sends the list pickled and base64-encoded in `update_info`'s
``ipc_handles_pickled`` (vLLM's field, with ``names``, ``dtype_names`` and ``shapes``). The
server maps the trainer's memory and copies each tensor into its model: one device-to-device
copy per tensor, no host memory, no process group.

Unpickling what arrives over HTTP could run any code, so the server reads the handles with
`read_handles`, an unpickler that resolves only the few torch names a CUDA tensor's handle
contains (the rebuild function, tensor and storage classes, `torch.Size`, dtypes) and refuses
everything else, and only when it was started with ``--transfer-backend ipc`` (vLLM asks for
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` instead and unpickles anything).

>>> import pickle, base64, os
>>> evil = base64.b64encode(pickle.dumps([{"GPU-x": (os.system, ("true",))}])).decode()
>>> try:
...     read_handles(evil)
... except IpcError as exc:
...     print(str(exc).removeprefix("ipc_handles_pickled: ")[:40])
posix.system is not part of a CUDA tenso
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from typing import Any

__all__ = ["IpcError", "export_handles", "gpu_uuid", "open_tensor", "read_handles"]

# (module, name) pairs a CUDA tensor's IPC handle pickles to, besides torch's dtypes.
ALLOWED = {
    ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
    ("torch", "Tensor"),
    ("torch._tensor", "Tensor"),
    ("torch.nn.parameter", "Parameter"),
    ("torch", "Size"),
    ("torch", "UntypedStorage"),
    ("torch.storage", "UntypedStorage"),
    ("torch.storage", "TypedStorage"),
}
DEVICE_ARG = 6  # where rebuild_cuda_tensor takes the storage's device index


class IpcError(ValueError):
    """IPC handles that cannot be read or opened here; the message says why."""


class _TorchHandles(pickle.Unpickler):
    """Resolves only the names in `ALLOWED` and torch dtypes (see the module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise IpcError(
            f"ipc_handles_pickled: {module}.{name} is not part of a CUDA tensor's IPC handle;"
            " refused"
        )


def gpu_uuid(device: Any) -> str:
    """The physical GPU's UUID as NVML writes it (``GPU-xxxxxxxx-...``), for a CUDA device."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def export_handles(tensors: list[Any]) -> str:
    """The trainer's side: each CUDA tensor's IPC handle under its GPU's UUID, pickled and
    base64-encoded (``ipc_handles_pickled``). Call after the step's kernels have finished
    (`torch.cuda.synchronize`), and keep the tensors unchanged until the server has copied."""
    from torch.multiprocessing.reductions import reduce_tensor

    handles = []
    for tensor in tensors:
        if not tensor.is_cuda:
            raise IpcError(f"ipc transfer needs tensors on a GPU, got one on {tensor.device}")
        handle = reduce_tensor(tensor.detach().contiguous())  # type: ignore[no-untyped-call]
        handles.append({gpu_uuid(tensor.device): handle})
    return base64.b64encode(pickle.dumps(handles)).decode("ascii")


def read_handles(text: Any) -> list[dict[str, Any]]:
    """The server's side: the handle list of ``ipc_handles_pickled``, read by the restricted
    unpickler; `IpcError` for anything else."""
    if not isinstance(text, str) or not text:
        raise IpcError("ipc_handles_pickled must be a non-empty base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IpcError(f"ipc_handles_pickled is not base64: {exc}") from None
    try:
        handles = _TorchHandles(io.BytesIO(raw)).load()
    except IpcError:
        raise
    except Exception as exc:  # a malformed pickle raises many kinds
        raise IpcError(f"ipc_handles_pickled cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(handles, list) or not all(isinstance(h, dict) for h in handles):
        raise IpcError("ipc_handles_pickled must hold a list of {GPU UUID: handle} objects")
    return handles


def open_tensor(handle: dict[str, Any], device: Any) -> Any:
    """Map the trainer's tensor that `handle` names on `device` (this process's CUDA device,
    which must be the same physical GPU); `IpcError` when it is another GPU's."""
    import torch

    mine = gpu_uuid(device)
    if mine not in handle:
        raise IpcError(
            f"the trainer's tensors are on GPU {', '.join(map(str, handle)) or '(none)'}, this"
            f" server is on {mine}: ipc transfer needs both on the same GPU (use nccl otherwise)"
        )
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    func, args = handle[mine]
    if func is not rebuild_cuda_tensor:
        raise IpcError("an IPC handle must rebuild a CUDA tensor")
    index = torch.device(device).index
    args = list(args)  # the trainer numbers GPUs its own way: this process's index of the GPU
    args[DEVICE_ARG] = torch.cuda.current_device() if index is None else index
    return rebuild_cuda_tensor(*args)
