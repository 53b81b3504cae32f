"""LoRA adapters in PEFT's file format: save, load, check, merge into a model and unmerge.

An adapter is a directory holding two files, as PEFT writes them (peft itself is not needed):

- `adapter_config.json`: `{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules":
  ["q_proj", ...], "base_model_name_or_path": "...", ...}`.
- `adapter_model.safetensors`: for every adapted linear layer at HF module path `P` (e.g.
  `model.layers.0.self_attn.q_proj`), `base_model.model.P.lora_A.weight` of shape `[r, in]` and
  `base_model.model.P.lora_B.weight` of shape `[out, r]`.

The layer's weight becomes `W + scale * (lora_alpha / r) * B @ A` (`lora_alpha / sqrt(r)` with
`use_rslora`). `merge_adapter` keeps an exact copy of every weight it changes and
`unmerge_adapter` copies it back, so unmerging restores the base bit for bit.

Example (what a trainer does after an update):

    save_adapter("runs/step-10/adapter", {"model.layers.0.self_attn.q_proj": (A, B)},
                 r=8, alpha=16, target_modules=["q_proj"], base_model="Qwen/Qwen3-0.6B")

Importing this module does not import torch; its functions do.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."
_BACKUP_ATTR = "_atropos_lora_backup"
_UNSUPPORTED = {  # config keys whose non-default values we cannot honour
    "use_dora": False,
    "fan_in_fan_out": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "modules_to_save": None,
}


class AdapterError(ValueError):
    """A malformed adapter, or one that does not fit the model; the message names the problem."""


class AdapterNotFound(AdapterError):
    """No adapter at that path: the directory or its `adapter_config.json` is missing."""


@dataclass
class LoraAdapter:
    """One LoRA adapter: `weights[module_path] = (A [r, in], B [out, r])`."""

    r: int
    alpha: float
    target_modules: list[str]
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    base_model: str = ""
    use_rslora: bool = False
    path: str = ""

    @property
    def scaling(self) -> float:
        """The factor on `B @ A`: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA."""
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def save_adapter(
    path: str | os.PathLike[str],
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]],
    *,
    r: int,
    alpha: float,
    target_modules: list[str],
    base_model: str = "",
) -> None:
    """Write `weights` (`{hf_module_path: (A, B)}`) as a PEFT adapter directory at `path`.

    Each file is written to a temporary name and renamed into place, so a server loading the
    directory never sees a half-written file.
    """
    from safetensors.torch import save_file

    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"r must be a positive integer, got {r!r}")
    if not weights:
        raise AdapterError("weights is empty: an adapter needs at least one module")
    tensors = {}
    for module, pair in weights.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise AdapterError(f"weights[{module!r}] must be a tuple (A, B)")
        a, b = pair
        _check_pair(module, a, b, r)
        tensors[f"{KEY_PREFIX}{module}.lora_A.weight"] = a.detach().to("cpu").contiguous()
        tensors[f"{KEY_PREFIX}{module}.lora_B.weight"] = b.detach().to("cpu").contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": list(target_modules),
        "base_model_name_or_path": base_model,
        "lora_dropout": 0.0,
        "bias": "none",
        "inference_mode": True,
        "use_rslora": False,
        **_UNSUPPORTED,
    }
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    with _atomic(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    with _atomic(directory / CONFIG_FILE) as tmp:
        Path(tmp).write_text(json.dumps(config, indent=2) + "\n")


class _atomic:
    """`with _atomic(target) as tmp:` write `tmp`; it replaces `target` only on success."""

    def __init__(self, target: Path) -> None:
        self.target = target
        fd, self.tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)

    def __enter__(self) -> str:
        return self.tmp

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.target)
        else:
            os.unlink(self.tmp)


def load_adapter(path: str | os.PathLike[str]) -> LoraAdapter:
    """Read and check a PEFT LoRA directory; raises `AdapterNotFound` or `AdapterError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(path)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not directory.is_dir():
        raise AdapterNotFound(f"No adapter found for {str(path)!r}: not a directory")
    if not config_path.is_file():
        raise AdapterNotFound(f"No adapter found for {str(path)!r}: {CONFIG_FILE} is missing")
    config = _read_config(config_path)
    if not weights_path.is_file():
        raise AdapterError(f"{weights_path} is missing (only safetensors adapters are supported)")
    try:
        tensors = load_file(weights_path)
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{weights_path} is not a readable safetensors file: {exc}") from exc
    r = config["r"]
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, half = _split_key(key, weights_path)
        halves.setdefault(module, {})[half] = tensor
    weights = {}
    for module, pair in halves.items():
        missing = {"lora_A", "lora_B"} - set(pair)
        if missing:
            raise AdapterError(f"{weights_path}: module {module!r} has no {sorted(missing)[0]}")
        _check_pair(module, pair["lora_A"], pair["lora_B"], r)
        weights[module] = (pair["lora_A"], pair["lora_B"])
    if not weights:
        raise AdapterError(f"{weights_path} holds no LoRA weights")
    targets = config.get("target_modules") or []
    return LoraAdapter(
        r=r,
        alpha=float(config["lora_alpha"]),
        target_modules=[targets] if isinstance(targets, str) else list(targets),
        weights=weights,
        base_model=str(config.get("base_model_name_or_path") or ""),
        use_rslora=bool(config.get("use_rslora")),
        path=str(directory),
    )


def _read_config(config_path: Path) -> dict[str, Any]:
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):  # the parser's message may quote the file: say no more
        raise AdapterError(f"{config_path} is not valid JSON") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_path}: peft_type must be 'LORA'")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"{config_path}: r must be a positive integer")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterError(f"{config_path}: lora_alpha must be a number")
    for key, default in _UNSUPPORTED.items():
        if config.get(key) not in (default, None, {}, []):
            raise AdapterError(f"{config_path}: {key} other than {default!r} is not supported")
    return config


def _split_key(key: str, source: Path) -> tuple[str, str]:
    """`base_model.model.P.lora_A.weight` -> (`P`, `lora_A`)."""
    for half in ("lora_A", "lora_B"):
        suffix = f".{half}.weight"
        if key.startswith(KEY_PREFIX) and key.endswith(suffix):
            module = key[len(KEY_PREFIX) : -len(suffix)]
            if module:
                return module, half
    raise AdapterError(
        f"{source}: unexpected tensor {key!r} (expected "
        f"'{KEY_PREFIX}<module path>.lora_A.weight' or '.lora_B.weight')"
    )


def _check_pair(module: str, a: Any, b: Any, r: int) -> None:
    if getattr(a, "ndim", None) != 2 or getattr(b, "ndim", None) != 2:
        raise AdapterError(f"module {module!r}: lora_A and lora_B must be 2-D tensors")
    if a.shape[0] != r or b.shape[1] != r:
        raise AdapterError(
            f"module {module!r}: shape mismatch, lora_A is {list(a.shape)} and lora_B is "
            f"{list(b.shape)}; expected [r, in] and [out, r] with r={r}"
        )


def check_adapter(model: torch.nn.Module, adapter: LoraAdapter) -> None:
    """Raise `AdapterError` unless every adapted module exists in `model` with a fitting weight."""
    for module, (a, b) in adapter.weights.items():
        try:
            target = model.get_submodule(module)
        except AttributeError:
            raise AdapterError(
                f"unknown module path {module!r}: the model has no such module"
            ) from None
        weight = getattr(target, "weight", None)
        if weight is None or weight.ndim != 2:
            raise AdapterError(f"module {module!r} has no 2-D weight to adapt")
        expected = [b.shape[0], a.shape[1]]
        if list(weight.shape) != expected:
            raise AdapterError(
                f"module {module!r}: shape mismatch, the model's weight is {list(weight.shape)}"
                f" but B @ A is {expected}"
            )


def merge_adapter(model: torch.nn.Module, adapter: LoraAdapter, scale: float = 1.0) -> None:
    """Add `scale * adapter.scaling * B @ A` to each adapted weight, keeping exact copies.

    The model is checked first, so a failing adapter changes nothing. Only one adapter may be
    merged at a time: `unmerge_adapter` first.
    """
    import torch

    check_adapter(model, adapter)
    if getattr(model, _BACKUP_ATTR, None):
        raise RuntimeError("an adapter is already merged into this model: unmerge_adapter first")
    backup: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for module, (a, b) in adapter.weights.items():
            weight = _weight(model, module)
            backup[module] = weight.detach().clone()
            delta = b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32)
            weight.add_((delta * (scale * adapter.scaling)).to(weight.dtype))
    setattr(model, _BACKUP_ATTR, backup)


def _weight(model: torch.nn.Module, module: str) -> torch.Tensor:
    import torch

    weight = model.get_submodule(module).weight
    if not isinstance(weight, torch.Tensor):
        raise AdapterError(f"module {module!r} has no weight tensor")
    return weight


def unmerge_adapter(model: torch.nn.Module) -> bool:
    """Restore the exact base weights saved by `merge_adapter`; False if none was merged."""
    import torch

    backup: dict[str, torch.Tensor] | None = getattr(model, _BACKUP_ATTR, None)
    if not backup:
        return False
    with torch.no_grad():
        for module, original in backup.items():
            _weight(model, module).copy_(original)
    setattr(model, _BACKUP_ATTR, None)
    return True
