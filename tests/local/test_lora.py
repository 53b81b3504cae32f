"""The PEFT adapter format of `atropos.local.lora`: save, load, check, merge, unmerge."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atropos.local.lora import (
    AdapterError,
    AdapterNotFound,
    check_adapter,
    load_adapter,
    merge_adapter,
    save_adapter,
    unmerge_adapter,
)

Q = "model.layers.0.self_attn.q_proj"
V = "model.layers.1.self_attn.v_proj"


def weights(reference, r: int = 2) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    out = {}
    for module in (Q, V):
        rows, cols = reference.get_submodule(module).weight.shape
        a = torch.randn(r, cols, generator=generator)
        b = torch.randn(rows, r, generator=generator)
        out[module] = (a, b)
    return out


def test_save_writes_peft_files_and_load_reads_them_back(reference, tmp_path):
    w = weights(reference)
    save_adapter(tmp_path, w, r=2, alpha=4, target_modules=["q_proj", "v_proj"], base_model="m")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 2 and config["lora_alpha"] == 4
    assert config["target_modules"] == ["q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "m"
    keys = set(load_file(tmp_path / "adapter_model.safetensors"))
    assert f"base_model.model.{Q}.lora_A.weight" in keys
    assert f"base_model.model.{V}.lora_B.weight" in keys and len(keys) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    adapter = load_adapter(tmp_path)
    assert (adapter.r, adapter.alpha, adapter.base_model, adapter.scaling) == (2, 4.0, "m", 2.0)
    for module, (a, b) in w.items():
        assert torch.equal(adapter.weights[module][0], a)
        assert torch.equal(adapter.weights[module][1], b)


def test_merge_adds_scaled_b_at_a_and_unmerge_restores_exactly(reference, tmp_path):
    model = copy.deepcopy(reference)
    w = weights(reference)
    save_adapter(tmp_path, w, r=2, alpha=4, target_modules=["q_proj", "v_proj"])
    adapter = load_adapter(tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merge_adapter(model, adapter, scale=0.5)
    a, b = w[Q]
    expected = before[f"{Q}.weight"] + 0.5 * 2.0 * (b @ a)
    assert torch.allclose(model.get_submodule(Q).weight, expected, atol=1e-6)
    with pytest.raises(RuntimeError, match="already merged"):
        merge_adapter(model, adapter)
    assert unmerge_adapter(model) is True
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert unmerge_adapter(model) is False


def test_missing_directory_or_config_is_not_found(tmp_path):
    with pytest.raises(AdapterNotFound, match="not a directory"):
        load_adapter(tmp_path / "nope")
    with pytest.raises(AdapterNotFound, match="adapter_config.json is missing"):
        load_adapter(tmp_path)


def write(path: Path, config: dict, tensors: dict | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, path / "adapter_model.safetensors")
    return path


GOOD = {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["q_proj"]}
A, B = f"base_model.model.{Q}.lora_A.weight", f"base_model.model.{Q}.lora_B.weight"


@pytest.mark.parametrize(
    ("config", "tensors", "needle"),
    [
        (GOOD, None, "adapter_model.safetensors is missing"),
        (GOOD | {"peft_type": "IA3"}, {}, "peft_type must be 'LORA'"),
        (GOOD | {"r": 0}, {}, "r must be a positive integer"),
        (GOOD | {"lora_alpha": "x"}, {}, "lora_alpha must be a number"),
        (GOOD | {"use_dora": True}, {}, "use_dora"),
        (GOOD, {A: torch.ones(3, 32), B: torch.ones(32, 3)}, "shape mismatch"),
        (GOOD, {A: torch.ones(2, 32)}, "has no lora_B"),
        (GOOD, {"model.x.weight": torch.ones(2)}, "unexpected tensor 'model.x.weight'"),
        (GOOD, {}, "holds no LoRA weights"),
    ],
)
def test_malformed_adapters_name_the_problem(tmp_path, config, tensors, needle):
    with pytest.raises(AdapterError, match=needle.replace("(", r"\(")):
        load_adapter(write(tmp_path / "a", config, tensors))


def test_adapters_that_do_not_fit_the_model_are_refused_before_any_change(reference, tmp_path):
    model = copy.deepcopy(reference)
    unknown = {"model.layers.7.self_attn.q_proj": (torch.ones(2, 32), torch.ones(32, 2))}
    save_adapter(tmp_path / "u", unknown, r=2, alpha=2, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match="unknown module path 'model.layers.7"):
        check_adapter(model, load_adapter(tmp_path / "u"))
    wide = weights(reference) | {V: (torch.ones(2, 31), torch.ones(16, 2))}
    save_adapter(tmp_path / "w", wide, r=2, alpha=2, target_modules=["q_proj"])
    before = model.get_submodule(Q).weight.clone()
    with pytest.raises(AdapterError, match="shape mismatch"):
        merge_adapter(model, load_adapter(tmp_path / "w"))
    assert torch.equal(model.get_submodule(Q).weight, before)


def test_save_refuses_bad_arguments(tmp_path):
    with pytest.raises(AdapterError, match="r must be"):
        save_adapter(tmp_path, {Q: (torch.ones(2, 4), torch.ones(4, 2))}, r=0, alpha=1,
                     target_modules=[])  # fmt: skip
    with pytest.raises(AdapterError, match="shape mismatch"):
        save_adapter(tmp_path, {Q: (torch.ones(2, 4), torch.ones(4, 3))}, r=2, alpha=1,
                     target_modules=[])  # fmt: skip
    with pytest.raises(AdapterError, match="empty"):
        save_adapter(tmp_path, {}, r=2, alpha=1, target_modules=[])
