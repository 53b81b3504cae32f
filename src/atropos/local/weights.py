"""Loading a model and replacing its weights in place from a checkpoint directory.

`load_fp32` is `AutoModelForCausalLM.from_pretrained` in float32 (the trainer's too), `load_model`
that on the chosen device for inference.
`read_checkpoint` and `check_checkpoint` read a HF checkpoint (`model.safetensors`, or shards
listed in `model.safetensors.index.json`) and make sure it fits the served model (same tensor
names and shapes; weights tied to another, which `save_pretrained` omits, may be absent) before
the engine copies it in between batches.
`untied_copy` writes a model whose LM head is tied to its embeddings with a head of its own
(vLLM on a CPU does not reload a tied head). `weights_checksum` fingerprints a state dict, so
two processes can tell their weights are equal bit for bit (the local server's `GET
/weights_checksum`, the trainer's tests and benchmark).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch


class WeightsError(ValueError):
    """A checkpoint that cannot replace the served weights; the message says why."""


def pick_device(device: str) -> str:
    """`auto` is cuda when available, else cpu; `cuda` must be available."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    return device


def load_fp32(model_dir: str, attention: str | None = None) -> Any:
    """`AutoModelForCausalLM.from_pretrained(model_dir)` in float32, whatever the transformers
    release calls the argument (`dtype` from 5 on, `torch_dtype` before: an unknown keyword
    would land in the model's config); no progress bar. `attention`: the attention
    implementation (transformers' `attn_implementation`), else the model's default; one
    transformers cannot load (flash-attn not installed) is a `WeightsError` naming it."""
    from atropos.inference.tokenizer import quiet_progress_bars

    transformers = quiet_progress_bars()
    major = int(transformers.__version__.split(".")[0])
    dtype_key = "dtype" if major >= 5 else "torch_dtype"
    kwargs: dict[str, Any] = {dtype_key: torch.float32}
    if attention is not None:
        kwargs["attn_implementation"] = attention
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    except (ImportError, ValueError) as err:  # a missing package, or a name it does not know
        if attention is None or (isinstance(err, ValueError) and attention not in str(err)):
            raise
        raise WeightsError(
            f"attention {attention!r}: transformers cannot use it for {model_dir} ({err});"
            " install what it names, or choose another (sdpa, eager, or auto)"
        ) from err


def load_model(model_dir: str, device: str) -> Any:
    """`load_fp32(model_dir)` on `device`, for inference."""
    model = load_fp32(model_dir)
    model.to(device).eval().requires_grad_(False)
    return model


def read_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a HF checkpoint directory (`model.safetensors` or a sharded index)."""
    from safetensors.torch import load_file

    directory = Path(path)
    if not directory.is_dir():
        raise WeightsError(f"model_path {path!r} is not a directory")
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    elif index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise WeightsError(f"{index} is not a valid safetensors index: {exc}") from exc
    else:
        raise WeightsError(f"{path!r} has no model.safetensors or model.safetensors.index.json")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(directory / name))
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"cannot read {directory / name}: {exc}") from exc
    return state


def check_checkpoint(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Raise `WeightsError` unless `state` fits `model` (names, shapes; tied weights may be
    omitted, as `save_pretrained` omits them)."""
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise WeightsError(f"the checkpoint has tensors the model lacks: {unexpected[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise WeightsError(
                f"{name}: shape {list(tensor.shape)} in the checkpoint, "
                f"{list(expected[name].shape)} in the model"
            )
    given = {expected[name].data_ptr() for name in state}
    missing = sorted(n for n in set(expected) - set(state) if expected[n].data_ptr() not in given)
    if missing:
        raise WeightsError(f"the checkpoint lacks tensors the model needs: {missing[:5]}")


def weights_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor of `state` in name order: name, dtype, shape, then its bytes
    (equal checksums: the same names holding bit-identical values)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def untied_copy(model_dir: str | Path, dest: str | Path) -> Path:
    """The model at `model_dir` saved at `dest` with an LM head of its own: the same weights
    (the head a copy of the embeddings), `tie_word_embeddings` false. vLLM reloads such a model
    whole; a tied one keeps its old head on a CPU (module docstring). Trained from this copy, the
    head and the embeddings learn apart. Returns `dest` (made once; kept when it exists)."""
    import shutil

    from transformers import AutoTokenizer

    dest = Path(dest)
    if (dest / "config.json").exists():
        return dest
    model = load_fp32(str(model_dir))
    if model.config.tie_word_embeddings:
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp)
    tmp.rename(dest)
    return dest
