"""The trainer's processes: one by default, N under torchrun, and the few messages they exchange.

Without torchrun's variables the trainer is one process with no process group, as it always was.
Under ``torchrun --nproc-per-node N -m atropos.trainer ...`` (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set) every process joins one group, nccl on CUDA (one GPU each,
`cuda:LOCAL_RANK`) and gloo on CPU, and the model is sharded over them (`fsdp.py`), even with
N = 1. Rank 0 alone talks to the API and the inference servers; the others learn what it
decided through `broadcast`, and tell it about a signal through `any`.

Every exchange has the group's deadline (`timeout`): a rank that died or hangs makes the others
fail within it with `RanksError`, naming what they were waiting for (torchrun, seeing a worker
fail, then ends the job). Collectives inside FSDP's forward and backward have the same deadline.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RanksError(ConnectionError):
    """The other ranks did not answer within the deadline, or one of them died (an OSError, so
    `atropos train` reports it in one line and exits 1)."""


def pick_device(device: str, local_rank: int = 0) -> torch.device:
    """'auto' is CUDA when there is a GPU, else the CPU; under torchrun CUDA means the GPU of
    this process's local rank."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = torch.device(device)
    if chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", local_rank)
    return chosen


@dataclass
class Ranks:
    """This process's place among the trainer's processes (a world of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    distributed: bool = False  # a process group exists (torchrun), so the model is sharded
    timeout: float = 900.0

    @property
    def main(self) -> bool:
        """Rank 0: the one process that talks to the API and the inference servers."""
        return self.rank == 0

    @classmethod
    def from_env(
        cls, device: str = "auto", timeout: float = 900.0, env: Mapping[str, str] = os.environ
    ) -> Ranks:
        """One process without torchrun's variables; else join the group they describe."""
        if "WORLD_SIZE" not in env:
            return cls(device=pick_device(device), timeout=timeout)
        missing = [name for name in TORCHRUN_VARIABLES if name not in env]
        if missing:
            raise ValueError(
                f"WORLD_SIZE is set but {', '.join(missing)} is not: start the trainer with"
                " torchrun (torchrun --nproc-per-node N -m atropos.trainer ...), which sets all of"
                f" {', '.join(TORCHRUN_VARIABLES)}"
            )
        import torch.distributed as dist

        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        chosen = pick_device(device, local)
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        dist.init_process_group(
            "nccl" if chosen.type == "cuda" else "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
            device_id=chosen if chosen.type == "cuda" else None,
        )
        return cls(rank, world, local, chosen, True, timeout)

    def close(self) -> None:
        """Leave the group (nothing to do for one process)."""
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    # ----- the messages ----------------------------------------------------------------------

    def _collective(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except (RuntimeError, ConnectionError) as err:  # gloo and nccl failures, timeouts
            raise RanksError(
                f"rank {self.rank} of {self.world}: no answer from the other ranks while {what}"
                f" (deadline {self.timeout:.0f} s): a rank died or hangs; torchrun ends the job"
                f" ({type(err).__name__}: {str(err)[:300]})"
            ) from err

    def broadcast(self, value: T, what: str) -> T:
        """Rank 0's `value` on every rank (picklable)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box: list[Any] = [value if self.main else None]
        self._collective(what, lambda: dist.broadcast_object_list(box, src=0))
        result: T = box[0]
        return result

    def any(self, flag: bool, what: str) -> bool:
        """True on every rank when `flag` is true on any of them."""
        if not self.distributed:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        self._collective(what, lambda: dist.all_reduce(value, op=dist.ReduceOp.MAX))
        return bool(value.item() > 0)

    def gather(self, value: T, what: str) -> list[T]:
        """Every rank's `value`, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        found: list[Any] = [None] * self.world
        self._collective(what, lambda: dist.all_gather_object(found, value))
        return found

    def barrier(self, what: str) -> None:
        """Wait until every rank is here."""
        if self.distributed:
            import torch.distributed as dist

            ids = [self.device.index] if self.device.type == "cuda" else None
            self._collective(what, lambda: dist.barrier(device_ids=ids))
