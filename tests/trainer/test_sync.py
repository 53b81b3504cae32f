"""Weight sync: reload into the local server, restart a server, LoRA hot-swap (vLLM endpoints)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.demo.procs import wait_until_up  # noqa: E402
from atropos.testing import FakeInferenceServer, free_port, serve_in_thread  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402


def served_version(base: str) -> int:
    body = {"prompt": "hi", "max_tokens": 1, "temperature": 0}
    return int(httpx.post(f"{base}/v1/completions", json=body, timeout=30).json()["policy_version"])


def test_reload_mode_pushes_each_step_to_the_local_server(tiny_model_dir: Path, tmp_path: Path):
    port = free_port()
    argv = [sys.executable, "-m", "atropos", "local", "serve", str(tiny_model_dir)]
    server = subprocess.Popen([*argv, "--port", str(port)], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/health", 60)
        assert served_version(base) == 0
        with serve_in_thread(create_app()) as url:
            push_groups(url, 4)
            out = tmp_path / "run"
            cfg = config(tiny_model_dir, url, out, steps=2, sync="reload", server_url=f"{base}/v1")
            train(cfg)
            # the trainer said which weights the server serves: environments stamp with it
            assert httpx.get(f"{url}/status").json()["policy_version"] == 2
        assert [m["served_policy_version"] for m in metrics(out)] == [1, 2]
        assert served_version(base) == 2
        assert sorted(p.name for p in (out / "weights").iterdir()) == ["v1", "v2"]
    finally:
        server.terminate()
        server.wait(30)


def test_restart_mode_restarts_its_own_server_on_the_new_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    command = (
        f"{sys.executable} -m atropos local serve {{model}} --port {{port}} "
        "--policy-version {version}"
    )
    base = f"http://127.0.0.1:{port}"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2)
        out = tmp_path / "run"
        cfg = config(
            tiny_model_dir, url, out, steps=1, sync="restart", server_url=f"{base}/v1",
            server_command=command,
        )  # fmt: skip
        train(cfg)
    assert metrics(out)[-1]["served_policy_version"] == 1
    with pytest.raises(httpx.TransportError):  # the trainer stopped the server it started
        httpx.get(f"{base}/health", timeout=2)


def test_lora_mode_hot_swaps_adapters_through_vllms_endpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from atropos.local.lora import load_adapter

    with FakeInferenceServer() as srv, serve_in_thread(create_app()) as url:
        push_groups(url, 4)
        out = tmp_path / "run"
        cfg = config(
            tiny_model_dir, url, out, steps=2, sync="lora", server_url=f"{srv.url}/v1",
            lora_r=4, lora_alpha=8.0, lora_targets=["q_proj", "v_proj"], lora_name="policy",
        )  # fmt: skip
        train(cfg)
        events = srv.lora.history
    adapters = out / "adapters"
    assert [(e.action, e.name) for e in events] == [("load", "policy")] * 3  # v0, v1, v2
    assert [Path(str(e.path)).name for e in events] == ["v0", "v1", "v2"]
    adapter = load_adapter(adapters / "v2")
    assert adapter.r == 4 and sorted(adapter.weights)[0] == "model.layers.0.self_attn.q_proj"
    a, b = adapter.weights["model.layers.0.self_attn.q_proj"]
    assert float(b.abs().sum()) > 0  # B starts at zero; two steps moved it
    assert (out / "checkpoints" / "step_2" / "adapter" / "adapter_config.json").exists()


def test_every_server_gets_the_version_and_one_restarting_is_waited_for(tmp_path: Path):
    """Replicas (`--server-url A,B`) each get the reload; B is down for a second (restarting
    under a launcher) and is retried, not failed."""
    import threading
    import time

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from atropos.trainer.sync import SyncError, WeightSync

    seen: list[tuple[str, dict]] = []

    def app(name: str) -> Starlette:
        async def reload(request: Request) -> JSONResponse:
            seen.append((name, await request.json()))
            return JSONResponse({"policy_version": 7})

        return Starlette(routes=[Route("/update_weights_from_disk", reload, methods=["POST"])])

    late_port = free_port()

    def start_late(stop: threading.Event) -> None:
        time.sleep(1.0)
        with serve_in_thread(app("b"), port=late_port):
            stop.wait(30)

    stop = threading.Event()
    late = threading.Thread(target=start_late, args=(stop,), daemon=True)
    with serve_in_thread(app("a")) as a:
        late.start()
        urls = f"{a}/v1,http://127.0.0.1:{late_port}/v1"
        sync = WeightSync("reload", tmp_path, urls, health_timeout=20)
        try:
            t0 = time.monotonic()
            sync._post("/update_weights_from_disk", {"model_path": "/w", "policy_version": 7})
            assert 0.5 < time.monotonic() - t0 < 10
        finally:
            stop.set()
            late.join(10)
            sync.close()
    assert [name for name, _ in seen] == ["a", "b"]
    gone = WeightSync("reload", tmp_path, f"http://127.0.0.1:{free_port()}/v1", health_timeout=1)
    with pytest.raises(SyncError, match="did not come back within 1 s"):
        gone._post("/update_weights_from_disk", {})
    gone.close()
    with pytest.raises(ValueError, match="restart' runs one server"):
        WeightSync("restart", tmp_path, "http://a/v1,http://b/v1", server_command="x {model}")


def _vllm_stand_in(calls: list[str], dev_mode: bool = True):
    """vLLM's HTTP side as the reload sees it: no /update_weights_from_disk (404), and with
    dev mode the pause, RPC, prefix-cache and resume routes."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def route(request: Request) -> JSONResponse:
        query = f"?{request.url.query}" if request.url.query else ""
        body = (await request.body()).decode()
        calls.append(f"{request.url.path}{query} {body}".strip())
        if request.url.path == "/reset_prefix_cache":
            return JSONResponse({"success": True})
        return JSONResponse({"results": [None]} if "rpc" in request.url.path else {})

    paths = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"] if dev_mode else []
    return Starlette(routes=[Route(p, route, methods=["POST"]) for p in paths])


def test_reload_into_vllm_pauses_reloads_forgets_the_cache_and_resumes(tmp_path, caplog):
    """The call sequence against vLLM's routes (tests/vllm/test_sync.py runs it against vLLM
    itself): detected once by the 404, then pause(wait), reload_weights, reset, resume; a
    checkpoint that ties its head is warned about once."""
    import json
    import logging

    from atropos.trainer.sync import WeightSync

    calls: list[str] = []
    with serve_in_thread(_vllm_stand_in(calls)) as url:
        sync = WeightSync("reload", tmp_path, f"{url}/v1")
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        (ckpt / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
        with caplog.at_level(logging.WARNING, "atropos.trainer"):
            assert sync._reload(ckpt, 3) == 3
            assert sync._reload(ckpt, 4) == 4
        sync.close()
    rpc = json.dumps({"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}})
    one = ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache"]
    assert [c.split(" ")[0] for c in calls] == [*one, "/resume"] * 2
    assert json.loads(calls[1].split(" ", 1)[1]) == json.loads(rpc)
    assert sum("ties its LM head" in r.getMessage() for r in caplog.records) == 1


def test_reload_into_vllm_without_dev_mode_says_how_to_start_it(tmp_path):
    from atropos.trainer.sync import SyncError, WeightSync

    calls: list[str] = []
    with serve_in_thread(_vllm_stand_in(calls, dev_mode=False)) as url:
        sync = WeightSync("reload", tmp_path, f"{url}/v1")
        with pytest.raises(SyncError, match="VLLM_SERVER_DEV_MODE=1"):
            sync._reload(tmp_path, 1)
        sync.close()
