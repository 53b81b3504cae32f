"""The weight-update process group: the trainer (rank 0) and inference workers (ranks 1..).

Both ends join it the same way, whatever the backend (`gloo` on CPUs, `nccl` on GPUs): a
`torch.distributed` TCP rendezvous at ``tcp://MASTER_ADDRESS:MASTER_PORT`` (the trainer, rank 0,
holds the store, listening on that address only), then a process group of its own named
`group_name`, built as SGLang's
`init_custom_process_group` builds it (the store prefixed with the group's name), so it never
needs or touches the default group (a trainer under torchrun keeps its own). Tensors then go by
`broadcast` from rank 0.

A tensor travels on the backend's device (`wire_device`): CPU for gloo, the current CUDA device
for nccl; `send` and `receive_into` move or stage it when the model lives elsewhere or in
another dtype. The store has no authentication and gloo's own connections listen where torch
puts them (the address of the host's name, or `GLOO_SOCKET_IFNAME`): run transfers on a
trusted network.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")
DEFAULT_GROUP = "weight_update_group"  # SGLang's default name


def group_name_for(master_port: int) -> str:
    """The group's name when the protocol carries none (vLLM's): one per rendezvous port, so a
    process can open a new group while an old one is still being torn down."""
    return f"{DEFAULT_GROUP}_{master_port}"


class GroupError(RuntimeError):
    """The process group could not be formed or used; the message says what and where."""


def wire_device(backend: str) -> torch.device:
    """Where tensors must be for `backend`: the CPU for gloo, the current GPU for nccl."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dtype_from_name(name: str) -> torch.dtype:
    """`"float32"` -> `torch.float32` (the names vLLM and SGLang send); ValueError otherwise."""
    value = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `"float32"`."""
    return str(dtype).removeprefix("torch.")


class WeightGroup:
    """One joined process group: `broadcast` from rank 0, `close` to leave it."""

    def __init__(
        self, pg: Any, store: Any, rank: int, world_size: int, backend: str, registered: bool = True
    ) -> None:
        """Keep the group and its store (the store must outlive the group); `registered`: the
        group is known to `torch.distributed` by name (`join_group`'s), not a bare one."""
        self.pg, self.store, self.registered = pg, store, registered
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = wire_device(backend)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` (on `self.device`, contiguous) from rank 0, in place elsewhere."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            self.pg.broadcast([tensor], options).wait()
        except RuntimeError as exc:
            raise GroupError(f"broadcast over the {self.backend} group failed: {exc}") from exc

    def send(self, tensor: torch.Tensor) -> None:
        """Rank 0: broadcast `tensor` as it is (moved to the wire device when needed)."""
        wire = tensor.detach()
        if wire.device != self.device or not wire.is_contiguous():
            wire = wire.to(self.device).contiguous()
        self.broadcast(wire)

    def receive_into(self, target: torch.Tensor, dtype: torch.dtype) -> None:
        """Rank > 0: receive one tensor sent as `dtype` into `target` (straight into it when
        device and dtype match, else through a buffer on the wire device)."""
        direct = target.device == self.device and target.dtype == dtype and target.is_contiguous()
        if direct:
            self.broadcast(target.data)
            return
        buffer = torch.empty(target.shape, dtype=dtype, device=self.device)
        self.broadcast(buffer)
        target.data.copy_(buffer)

    def close(self) -> None:
        """Leave the group (its name becomes free again)."""
        try:
            if self.registered:
                dist.destroy_process_group(self.pg)
            else:
                self.pg.shutdown()
        except (RuntimeError, KeyError, ValueError, AttributeError):  # already gone with its peers
            pass


def store_listener(master_address: str, master_port: int = 0) -> socket.socket:
    """Rank 0's store socket, bound to `master_address` only (port 0: a free one, race-free);
    `GroupError` when this host cannot bind that address."""
    try:
        return socket.create_server((master_address, master_port), backlog=128)
    except OSError as exc:
        raise GroupError(
            f"cannot listen on {master_address}:{master_port} for the weight-transfer group:"
            f" {exc} (give this host's address as the servers reach it, and a free port)"
        ) from exc


def _store(
    address: str, port: int, rank: int, world_size: int, limit: datetime.timedelta, listener: Any
) -> Any:
    """The rendezvous store: rank 0 serves it on `listener`, the others connect (as SGLang's
    ``tcp://`` rendezvous does)."""
    tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]  # public, not re-exported
    if rank == 0:
        return tcp_store(
            address, port, world_size, True, timeout=limit, wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )  # fmt: skip
    return tcp_store(address, port, world_size, False, timeout=limit)


def join_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    backend: str = "gloo",
    group_name: str | None = None,
    timeout: float = 300.0,
    listener: socket.socket | None = None,
    rendezvous_timeout: float | None = None,
) -> WeightGroup:
    """Join (rank 0: open, on `listener` or a new `store_listener`) the group named
    `group_name` (default: `group_name_for(port)`); blocks until all `world_size` members are
    in, or raises `GroupError` after `timeout` seconds (which also bounds every broadcast;
    `rendezvous_timeout`, when given, bounds the store's rendezvous instead)."""
    from torch.distributed import distributed_c10d

    if backend not in BACKENDS:
        raise GroupError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise GroupError("backend nccl needs a CUDA device; use gloo on CPU")
    if not 0 <= rank < world_size:
        raise GroupError(f"rank {rank} is outside a group of {world_size}")
    group_name = group_name or group_name_for(master_port)
    if group_name in distributed_c10d._world.pg_names.values():
        raise GroupError(f"this process is already in a group named {group_name!r}: close it")
    limit = datetime.timedelta(seconds=timeout)
    where = f"tcp://{master_address}:{master_port}"
    if rank == 0 and listener is None:
        listener = store_listener(master_address, master_port)
    try:
        meet = (
            limit if rendezvous_timeout is None else datetime.timedelta(seconds=rendezvous_timeout)
        )
        store = _store(master_address, master_port, rank, world_size, meet, listener)
        new_group: Any = distributed_c10d._new_process_group_helper  # SGLang's recipe
        made = new_group(
            world_size,
            rank,
            [],
            backend,
            distributed_c10d.PrefixStore(group_name, store),
            group_name=group_name,
            timeout=limit,
        )
        pg = made[0] if isinstance(made, tuple) else made
        distributed_c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    except (RuntimeError, ValueError, TimeoutError) as exc:  # DistStoreError is a RuntimeError
        raise GroupError(
            f"could not form the {backend} group {group_name!r} of {world_size} at {where}"
            f" as rank {rank} within {timeout:g} s: {exc}"
        ) from exc
    return WeightGroup(pg, store, rank, world_size, backend)


class UniqueIdGroup:
    """Rank 0 of an NCCL group whose other ranks join by its NCCL unique id, not by a store:
    vLLM's weight-transfer engine given ``nccl_unique_id_b64`` in its `init_info` (its
    "trainer without vLLM" rendezvous).

    A bare `ProcessGroupNCCL` over a private store only this process joins (world 1 for the
    store, `world_size` for the group), as vLLM's example trainer builds it. The communicator is
    made by the first collective: `open` starts the one-element float32 all-reduce vLLM's
    workers run once they have joined (in a thread: it blocks until every rank is in), and
    returns the unique id torch's rank 0 mints for it and writes under the store's key ``"0"``
    (torch's first communicator; an implementation detail vLLM's example relies on too);
    `joined` waits for that all-reduce, after which tensors go by `WeightGroup.broadcast`.
    """

    def __init__(self, world_size: int, timeout: float = 300.0) -> None:
        """Make the group (nothing is contacted yet); `GroupError` without NCCL or a GPU."""
        if not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise GroupError("an NCCL group needs a CUDA device and torch built with NCCL")
        self.timeout = datetime.timedelta(seconds=timeout)
        tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]  # public, not re-exported
        self.store = tcp_store("127.0.0.1", 0, 1, True, timeout=self.timeout)
        nccl: Any = dist.ProcessGroupNCCL  # only in CUDA builds
        options = nccl.Options()
        options._timeout = self.timeout
        self.pg = nccl(self.store, 0, world_size, options)
        self.group = WeightGroup(self.pg, self.store, 0, world_size, "nccl", registered=False)
        self._warmup: Any = None

    def open(self) -> bytes:
        """Start the warm-up all-reduce; the 128-byte unique id the other ranks must join by."""
        import threading

        done: dict[str, Any] = {}

        def warmup() -> None:
            try:
                data = torch.zeros(1, dtype=torch.float32, device=self.group.device)
                self.pg.allreduce([data]).wait()
                done["ok"] = True
            except RuntimeError as exc:
                done["error"] = exc

        self._warmup = (threading.Thread(target=warmup, daemon=True), done)
        self._warmup[0].start()
        try:
            self.store.wait(["0"], self.timeout)
            return bytes(self.store.get("0"))
        except RuntimeError as exc:
            raise GroupError(
                f"torch minted no NCCL unique id within {self.timeout}: {exc}"
            ) from exc

    def joined(self) -> WeightGroup:
        """Wait for every rank's warm-up all-reduce; the group, ready for broadcasts."""
        thread, done = self._warmup
        thread.join(self.timeout.total_seconds())
        if "ok" not in done:
            reason = done.get("error") or f"not every rank joined within {self.timeout}"
            raise GroupError(f"the NCCL group by unique id did not form: {reason}")
        return self.group
