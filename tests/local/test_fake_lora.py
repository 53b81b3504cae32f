"""vLLM's LoRA endpoints on FakeInferenceServer (`atropos.testing.fake_lora`)."""

from __future__ import annotations

import httpx

from atropos.testing import FakeInferenceServer
from atropos.testing.fake_lora import LoraEvent


def test_the_fake_server_loads_lists_serves_and_unloads_adapters(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 2}')
    with FakeInferenceServer() as srv, httpx.Client(base_url=srv.url) as client:
        load = "/v1/load_lora_adapter"
        r = client.post(load, json={"lora_name": "a", "lora_path": str(adapter)})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a' added successfully."
        cards = client.get("/v1/models").json()["data"]
        assert [(c["id"], c.get("parent")) for c in cards] == [(srv.model, None), ("a", srv.model)]
        r = client.post(
            "/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 2}
        )  # fmt: skip
        assert r.status_code == 200 and r.json()["model"] == "a"
        again = client.post(load, json={"lora_name": "a", "lora_path": str(adapter)})
        assert again.status_code == 400
        assert again.json()["error"]["message"] == "The lora adapter 'a' has already been loaded."
        inplace = {"lora_name": "a", "lora_path": str(adapter), "load_inplace": True}
        assert client.post(load, json=inplace).status_code == 200  # vLLM's in-place swap
        bad = client.post(load, json={"lora_name": "b", "lora_path": str(tmp_path)})
        assert bad.status_code == 404 and "No adapter found" in bad.json()["error"]["message"]
        missing = client.post(load, json={"lora_name": "b"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
        unload = "/v1/unload_lora_adapter"
        r = client.post(unload, json={"lora_name": "a"})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a' removed successfully."
        assert client.post(unload, json={"lora_name": "a"}).status_code == 404
        assert [c["id"] for c in client.get("/v1/models").json()["data"]] == [srv.model]
        assert srv.lora.history == [
            LoraEvent("load", "a", str(adapter)),
            LoraEvent("load", "a", str(adapter)),
            LoraEvent("unload", "a"),
        ]
        assert srv.lora.adapters == {}
