"""LoRA for training, without peft: wrap chosen `nn.Linear` layers with a low-rank update.

``y = W x + (alpha / r) * B (A x)``, with ``A`` (``[r, in]``) initialised like a linear layer
and ``B`` (``[out, r]``) at zero, so a freshly wrapped model computes exactly what it did
before. Only ``A`` and ``B`` train. `adapter_weights` gives the ``{module path: (A, B)}`` that
`atropos.local.lora.save_adapter` writes in PEFT's file format, which vLLM and our local server
both load.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoraLinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        self.r, self.alpha = r, alpha
        self.scale = alpha / r
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=base.weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = (x @ self.lora_A.t()) @ self.lora_B.t()
        out: torch.Tensor = self.base(x) + update * self.scale
        return out


def apply_lora(model: nn.Module, targets: list[str], r: int, alpha: float) -> list[str]:
    """Wrap every `nn.Linear` whose name ends with one of `targets`; freeze everything else.

    Returns the wrapped module paths. Raises ValueError when no layer matches.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped: list[str] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.split(".")[-1] in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoraLinear(module, r, alpha))
            wrapped.append(name)
    if not wrapped:
        names = sorted(
            {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ValueError(f"lora_targets {targets} match no linear layer; the model has {names}")
    return wrapped


def adapter_weights(
    model: nn.Module, state: dict[str, torch.Tensor] | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module path: (A, B)}`` of every `LoraLinear`, detached copies on the CPU, read from
    `state` (the model's whole state dict, as gathered from a sharded model) or the model's."""
    state = model.state_dict() if state is None else state
    return {
        name: (
            state[f"{name}.lora_A"].detach().cpu().clone(),
            state[f"{name}.lora_B"].detach().cpu().clone(),
        )
        for name, m in model.named_modules()
        if isinstance(m, LoraLinear)
    }
