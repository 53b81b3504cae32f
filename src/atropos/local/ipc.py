"""CUDA IPC weight transfer: a trainer and a server sharing one GPU, the weights never copied
off it (vLLM's ``ipc`` weight-transfer backend, also `atropos local serve --transfer-backend ipc`).

The trainer exports each tensor as a CUDA IPC handle (`torch.multiprocessing.reductions.
reduce_tensor`: the rebuild function and its arguments), keyed by the physical GPU's UUID as
NVML writes it (``GPU-...``), and sends the list pickled and base64-encoded in `update_info`'s
``ipc_handles_pickled`` (vLLM's field, with ``names``, ``dtype_names`` and ``shapes``). The
server maps the trainer's memory and copies each tensor into its model: one device-to-device
copy per tensor, no host memory, no process group.

Unpickling what arrives over HTTP could run any code, so the server reads the handles with
`read_handles`, and only when it was started with ``--transfer-backend ipc`` (vLLM asks for
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` instead and unpickles anything). Before anything is
unpickled, `check_opcodes` walks the pickle (`pickletools.genops`) over a model of its stack:
only the opcodes plain data needs (lists, dicts, tuples, numbers, strings, bytes, the memo)
pass, with globals limited to the few torch names a CUDA tensor's handle contains (the
rebuild function, tensor and storage classes, `torch.Size`, dtypes) and REDUCE to calling
`torch.Size`; BUILD (an object's ``__setstate__`` or ``setattr``), INST, OBJ, NEWOBJ,
extensions and persistent ids are refused. The unpickler then resolves only those names.

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
import pickletools
from typing import Any

__all__ = [
    "IpcError",
    "check_opcodes",
    "export_handles",
    "gpu_uuid",
    "open_tensor",
    "read_handles",
]

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
REDUCIBLE = {("torch", "Size")}  # the only callable REDUCE may call (a handle's tensor size)
_SCALARS = {  # push one plain value
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
    "LONG4", "FLOAT", "BINFLOAT", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE",
}  # fmt: skip
_STRINGS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_TO_MARK = {"TUPLE", "LIST", "DICT", "APPENDS", "SETITEMS"}  # pop to the mark
_POPS = {"TUPLE1": (1, True), "TUPLE2": (2, True), "TUPLE3": (3, True),
         "APPEND": (1, False), "SETITEM": (2, False)}  # fmt: skip
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_MARK = object()


class IpcError(ValueError):
    """IPC handles that cannot be read or opened here; the message says why."""


def _allowed_global(module: str, name: str) -> bool:
    import torch

    if (module, name) in ALLOWED:
        return True
    return (
        module == "torch"
        and "." not in name
        and isinstance(getattr(torch, name, None), torch.dtype)
    )


def _refuse(what: str) -> IpcError:
    return IpcError(
        f"ipc_handles_pickled: {what} is not part of a CUDA tensor's IPC handle; refused"
    )


def check_opcodes(raw: bytes) -> None:
    """Walk the pickle `raw` without running it; `IpcError` on the first opcode, global or
    call a CUDA tensor handle's pickle cannot hold (see the module docstring)."""
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    try:
        for op, arg, _ in pickletools.genops(raw):
            _step(op.name, arg, stack, memo)
    except IpcError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # genops's, or our model's
        raise IpcError(f"ipc_handles_pickled cannot be read: {type(exc).__name__}: {exc}") from None


def _step(name: str, arg: Any, stack: list[Any], memo: dict[Any, Any]) -> None:
    """One opcode on the model stack: a global is ("global", module, name), a string
    ("str", text), anything else None."""
    if name in ("PROTO", "FRAME", "STOP"):
        return
    if name == "MARK":
        stack.append(_MARK)
    elif name in _SCALARS:
        stack.append(None)
    elif name in _STRINGS:
        stack.append(("str", arg))
    elif name in _TO_MARK:
        at = max(i for i, item in enumerate(stack) if item is _MARK)
        del stack[at:]
        if name in ("TUPLE", "LIST", "DICT"):
            stack.append(None)
    elif name in _POPS:
        count, pushes = _POPS[name]
        if len(stack) < count + (0 if pushes else 1) or _MARK in stack[-count:]:
            raise IndexError(f"{name} on a short stack")
        del stack[-count:]
        if pushes:
            stack.append(None)
    elif name in _PUTS or name == "MEMOIZE":
        memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
    elif name in _GETS:
        stack.append(memo[arg])
    elif name in ("GLOBAL", "STACK_GLOBAL"):
        stack.append(_global(name, arg, stack))
    elif name == "REDUCE":
        args, func = stack.pop(), stack.pop()
        if args is _MARK or not (isinstance(func, tuple) and func[0] == "global"):
            raise _refuse("REDUCE of something other than a global")
        if func[1:] not in REDUCIBLE:
            raise _refuse(f"a call of {func[1]}.{func[2]}")
        stack.append(None)
    else:
        raise _refuse(f"the pickle opcode {name}")


def _global(name: str, arg: Any, stack: list[Any]) -> tuple[str, str, str]:
    if name == "GLOBAL":
        module, _, attr = str(arg).partition(" ")
    else:
        attr_item, module_item = stack.pop(), stack.pop()
        if not (isinstance(attr_item, tuple) and isinstance(module_item, tuple)):
            raise _refuse("a global named by something other than two strings")
        if attr_item[0] != "str" or module_item[0] != "str":
            raise _refuse("a global named by something other than two strings")
        module, attr = module_item[1], attr_item[1]
    if not _allowed_global(module, attr):
        raise _refuse(f"{module}.{attr}")
    return ("global", module, attr)


class _TorchHandles(pickle.Unpickler):
    """Resolves only the names in `ALLOWED` and torch dtypes (see the module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if _allowed_global(module, name):
            return getattr(torch, name)
        raise _refuse(f"{module}.{name}")


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
    check_opcodes(raw)
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
