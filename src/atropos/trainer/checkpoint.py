"""Checkpoints: ``{out}/checkpoints/step_N``, the same layout for one process and for N.

- the weights as a Hugging Face model directory (``config.json``, ``model.safetensors``, the
  tokenizer), or the LoRA adapter in ``adapter/``: gathered on rank 0 and written by it, so a
  checkpoint is a model any server loads and any number of processes resumes from;
- ``optimizer/``: the AdamW state in `torch.distributed.checkpoint`'s sharded format, each rank
  writing its own shards (the state is twice the weights in float32: it never passes through
  one process). Loading reshards it to however many processes resume;
- ``state.json``, written last by rank 0: the step, the ids of the batches the checkpoint
  covers (acknowledged right after it; a resumed trainer acknowledges them first, in case a
  crash came in between), the number of processes that wrote it.

The directory is written as ``step_N.partial`` and renamed into place once every rank's part is
on disk, so a checkpoint found is complete; only the newest `keep` are kept. With several
machines, `--out-dir` must be a folder they all share. A checkpoint of an earlier release
(``optimizer.pt`` instead of ``optimizer/``) still loads in one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from atropos.trainer.fsdp import full_state_dict, is_sharded
from atropos.trainer.ranks import Ranks

FORMAT = 2  # 1: optimizer.pt (one process); 2: optimizer/ (sharded)


@dataclass
class Resumed:
    """What a checkpoint says beside the tensors."""

    step: int = 0
    batch_ids: list[str] = field(default_factory=list)
    world: int = 1


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint under `out`: a ``step_N`` directory with its
    ``state.json`` (a ``step_N.partial`` one, left by a crash before its rename, is not)."""
    found = [
        p
        for p in (out / "checkpoints").glob("step_*")
        if p.name[5:].isdigit() and (p / "state.json").exists()
    ]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def latest_step(out: Path) -> int:
    path = latest_checkpoint(out)
    return -1 if path is None else int(path.name[5:])


@contextlib.contextmanager
def _one_process_quietly(ranks: Ranks) -> Iterator[None]:
    """`torch.distributed.checkpoint` warns when there is no process group: for one process
    that is the intent, not a mistake."""
    with warnings.catch_warnings():
        if not ranks.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_checkpoint(
    out: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    opt: torch.optim.Optimizer,
    ranks: Ranks,
    *,
    lora: dict[str, Any],
    keep: int,
    batch_ids: list[str] | None = None,
) -> Path:
    """Write `step_N` (every rank calls this: the weights are gathered, the optimizer's shards
    written by each); returns its path."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    from atropos.trainer.sync import prune, save_lora

    final = out / "checkpoints" / f"step_{step}"
    tmp = final.with_name(final.name + ".partial")
    if ranks.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ranks.barrier("starting a checkpoint")
    weights = full_state_dict(model)  # every rank takes part; rank 0 gets them all
    if ranks.main and lora:
        save_lora(model, tmp / "adapter", state=weights, **lora)
    elif ranks.main:
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    del weights
    with _one_process_quietly(ranks):
        save(get_optimizer_state_dict(model, opt), checkpoint_id=str(tmp / "optimizer"))
    ranks.barrier("writing a checkpoint")
    if ranks.main:
        state = {"step": step, "batch_ids": batch_ids or [], "world": ranks.world}
        (tmp / "state.json").write_text(json.dumps(state | {"format": FORMAT}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune(final.parent, "step_", keep)
    return final


def load_lora_weights(path: Path, model: Any) -> None:
    """Copy the checkpoint's adapter into the model's `LoraLinear` layers (before sharding)."""
    from atropos.local.lora import load_adapter
    from atropos.trainer.lora import LoraLinear

    adapter = load_adapter(path / "adapter")
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear) and name in adapter.weights:
            a, b = adapter.weights[name]
            module.lora_A.data.copy_(a)
            module.lora_B.data.copy_(b)


def load_optimizer(path: Path, model: Any, opt: torch.optim.Optimizer, ranks: Ranks) -> Resumed:
    """Restore the optimizer state `save_checkpoint` wrote into `opt` (after sharding; the
    weights were loaded from `path` before); returns the step and the covered batch ids."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    state = json.loads((path / "state.json").read_text())
    legacy = path / "optimizer.pt"
    if legacy.exists() and not (path / "optimizer").exists():
        if is_sharded(model):
            raise ValueError(
                f"{path} is a checkpoint of an earlier release (optimizer.pt), which resumes in"
                " one process only: run `atropos train` once without torchrun for a step or"
                " more (its next checkpoint has the sharded format), then under torchrun"
            )
        opt.load_state_dict(torch.load(legacy, weights_only=True))
    else:
        with _one_process_quietly(ranks):
            current = get_optimizer_state_dict(model, opt)
            load(current, checkpoint_id=str(path / "optimizer"))
        set_optimizer_state_dict(model, opt, current)
    batch_ids = [str(b) for b in state.get("batch_ids", [])]
    return Resumed(int(state["step"]), batch_ids, int(state.get("world", 1)))
