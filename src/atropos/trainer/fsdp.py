"""The model across the trainer's processes: FSDP2 (`fully_shard`) over its blocks, and the
full weights gathered back when the inference servers or a checkpoint need them.

`shard` applies `fully_shard` to each of the model's blocks (the classes a Hugging Face model
names in `_no_split_modules`, e.g. `LlamaDecoderLayer`; else the children of its longest
`ModuleList`), to the input embedding and the output head when they are not tied, then to the
whole model (what is left: the final norm, or the tied embedding). Each parameter is cut in
dim-0 shards across the ranks; a block's parameters are gathered for its forward and backward
and freed after, and gradients are reduce-scattered in float32. On CUDA the gathered weights
are bfloat16 (`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`; the shards,
gradients and optimizer state stay float32); on the CPU everything is float32.

A model that is not sharded (one process without torchrun) passes through every function here
unchanged, so the trainer has one code path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from atropos.trainer.ranks import Ranks


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the modules of the classes it names in `_no_split_modules`
    (Hugging Face's own list), else the children of its longest `ModuleList`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    longest = max(lists, key=len, default=None)
    return list(longest) if longest is not None else []


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of keeping them (per block, the
    Hugging Face way, non-reentrant); ValueError for a model that cannot."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"--activation-checkpointing: {type(model).__name__} does not support activation"
            " checkpointing; leave the flag out"
        )
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]


def shard(model: nn.Module, ranks: Ranks) -> nn.Module:
    """`fully_shard` every block, then the model, over all ranks (in place; returns the model).
    Nothing happens without a process group."""
    if not ranks.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ranks.device.type, (ranks.world,))
    policy = MixedPrecisionPolicy()  # float32 throughout
    if ranks.device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    for table in untied_embeddings(model):
        fully_shard(table, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def untied_embeddings(model: nn.Module) -> list[nn.Module]:
    """The input embedding and the output head when they are separate weights (each its own
    FSDP unit, gathered only while it is used: at a 32k vocabulary each is as large as a few
    blocks); none when they are tied (one weight: it stays with the model's own unit)."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return []
    first, last = get_in(), get_out()
    if first is None or last is None:
        return []
    if getattr(first, "weight", None) is getattr(last, "weight", None):
        return []
    return [first, last]


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights: on rank 0 all of them on the CPU (gathered from the shards:
    a collective, every rank calls it), `{}` on the others; a weight tied to another (the
    embeddings and the head) once, under its first name, as an unsharded model's state has it
    for `save_pretrained`. An unsharded model gives its own `state_dict()` (no copy)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_model_state_dict(model, options=options)
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            full.pop(name, None)
        seen.add(id(tensor))
    return full


def named_full_tensors(model: nn.Module, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's tensors `names`, one at a time, each whole (a sharded one is gathered: a
    collective, so every rank iterates the same names in the same order and only one full
    tensor is alive at once)."""
    state = model.state_dict()
    for name in names:
        tensor: Any = state[name]
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor.detach()


def grad_norm_value(norm: torch.Tensor) -> float:
    """The float of `clip_grad_norm_`'s answer (a DTensor when the gradients are sharded)."""
    full: Any = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return float(full)
