"""`atropos train`'s weight sync: the client's `Publisher` (`atropos.client.publish`: the five
modes, the servers' routes), plus the trainer's own saving (its tokenizer with the weights, its
LoRA adapters in PEFT's format).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from atropos.client.publish import SYNC_MODES, Publisher, SyncError, prune, save_model

__all__ = ["SYNC_MODES", "SyncError", "WeightSync", "prune", "save_lora", "save_model"]


def save_lora(
    model: Any,
    path: Path,
    *,
    r: int,
    alpha: float,
    targets: list[str],
    base: str,
    state: dict[str, Any] | None = None,
) -> Path:
    """Write the model's LoRA adapter in PEFT's format atomically at `path` (read from `state`
    when given: the whole state dict gathered from a sharded model)."""
    from atropos.local.lora import save_adapter
    from atropos.trainer.lora import adapter_weights

    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapter(
        tmp,
        adapter_weights(model, state),
        r=r,
        alpha=alpha,
        target_modules=targets,
        base_model=base,
    )
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


class WeightSync(Publisher):
    """The trainer's `Publisher`: `server_url` (comma-separated) gets the weights; `lora` (r,
    alpha, targets, base) says how its adapters are written."""

    def __init__(
        self,
        mode: str,
        out_dir: Path,
        server_url: str,
        *,
        lora: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(mode, server_url, out_dir=out_dir, **options)
        self.lora = lora or {}

    def publish(
        self,
        model: Any,
        tokenizer: Any,
        version: int,
        waiting: Any = None,
        state: dict[str, Any] | None = None,
    ) -> float:
        """Make `version` the served policy (`Publisher.sync`); the seconds it took."""
        return self.sync(model, version, tokenizer=tokenizer, state=state, waiting=waiting)

    def save_adapter(self, model: Any, path: Path, state: dict[str, Any] | None) -> Path:
        return save_lora(model, path, state=state, **self.lora)
