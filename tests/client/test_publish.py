"""`publish` by reload into `atropos local serve` (in this process), and `paused()` pausing and
draining its generation around a block."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

pytest.importorskip("torch")

from atropos.api import create_app  # noqa: E402
from atropos.client import AsyncTrainerClient, Publisher, SyncError, TrainerClient  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402
from atropos.tiny.warmstart import policy_path  # noqa: E402


def complete(base: str) -> int:
    """One completion from the server at `base` (its `/v1` URL); the policy version it says."""
    body = {"model": "atropos-tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{base}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["policy_version"])


def is_paused(base: str) -> bool:
    return bool(httpx.get(f"{base.removesuffix('/v1')}/is_paused").json()["is_paused"])


@pytest.fixture(scope="module")
def server() -> object:
    with local_tiny_server(max_model_len=256) as base:
        yield base


def test_publish_by_reload_bumps_the_served_version(server: str, tmp_path: Path) -> None:
    from atropos.local.weights import load_fp32

    with serve_in_thread(create_app()) as url:
        client = TrainerClient(url, patience=5, servers=server, out_dir=tmp_path)
        assert client.publish(str(policy_path()), version=1) == 1  # a directory as it is
        assert complete(server) == 1
        model = load_fp32(str(policy_path()))
        assert client.publish(model, version=2) == 2  # a model: saved, then reloaded
        assert complete(server) == 2
        assert (tmp_path / "weights" / "v2" / "config.json").is_file()
        assert httpx.get(f"{url}/status").json()["policy_version"] == 2  # and the API told
        client.close()


def test_paused_holds_new_requests_until_the_block_ends(server: str) -> None:
    publisher = Publisher("reload", server)
    versions: list[int] = []
    with publisher.paused(timeout=30):
        assert is_paused(server)
        asked = threading.Thread(target=lambda: versions.append(complete(server)))
        asked.start()
        time.sleep(0.5)
        assert asked.is_alive() and not versions  # waits for the pause to end
    asked.join(60)
    assert len(versions) == 1 and not is_paused(server)
    with pytest.raises(RuntimeError, match="boom"), publisher.paused(timeout=30):
        raise RuntimeError("boom")
    assert not is_paused(server)  # resumed on every exit path
    publisher.close()


def test_paused_for_asyncio(server: str) -> None:
    async def run() -> tuple[bool, bool]:
        async with AsyncTrainerClient("http://127.0.0.1:1", servers=server) as client:
            async with client.paused(timeout=30):
                inside = await asyncio.to_thread(is_paused, server)
            return inside, await asyncio.to_thread(is_paused, server)

    assert asyncio.run(run()) == (True, False)


def test_a_server_that_cannot_pause_is_named() -> None:
    app = Starlette(routes=[Route("/health", lambda r: PlainTextResponse("ok"))])
    with serve_in_thread(app) as url:
        publisher = Publisher("reload", f"{url}/v1")
        with pytest.raises(SyncError, match="404 to /pause and /pause_generation"):
            with publisher.paused(timeout=5):
                pass
        publisher.close()


def test_transfer_wants_a_model_not_a_directory(tmp_path: Path) -> None:
    publisher = Publisher("transfer", "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="pass the model"):
        publisher.sync(tmp_path, 1)
    publisher.close()


def test_the_async_client_publishes_too(server: str) -> None:
    async def run(url: str) -> int:
        async with AsyncTrainerClient(url, patience=5, servers=server) as client:
            return await client.publish(str(policy_path()), version=7)

    with serve_in_thread(create_app()) as url:
        assert asyncio.run(run(url)) == 7
        assert httpx.get(f"{url}/status").json()["policy_version"] == 7
    assert complete(server) == 7


def test_a_pause_past_its_deadline_is_named_and_lifted() -> None:
    said: list[str] = []

    async def pause(request: object) -> PlainTextResponse:
        said.append("pause")
        await asyncio.sleep(3)  # requests in flight that do not finish
        return PlainTextResponse("ok")

    async def resume(request: object) -> PlainTextResponse:
        said.append("resume")
        return PlainTextResponse("ok")

    routes = [Route("/pause", pause, methods=["POST"]), Route("/resume", resume, methods=["POST"])]
    with serve_in_thread(Starlette(routes=routes)) as url:
        publisher = Publisher("reload", f"{url}/v1")
        with pytest.raises(SyncError, match="not paused within 0.3 s"):
            with publisher.paused(timeout=0.3):
                pass
        publisher.close()
    assert said == ["pause", "resume"]  # a pause that may still land is lifted


def test_lora_publishes_an_adapter_directory_by_name(tmp_path: Path) -> None:
    bodies: list[dict] = []

    async def load(request: Any) -> PlainTextResponse:
        bodies.append(await request.json())
        return PlainTextResponse("Success: LoRA adapter 'policy' added successfully.")

    app = Starlette(routes=[Route("/v1/load_lora_adapter", load, methods=["POST"])])
    with serve_in_thread(app) as url:
        publisher = Publisher("lora", f"{url}/v1")
        publisher.sync(tmp_path, 3)
        publisher.close()
    assert bodies == [{"lora_name": "policy", "lora_path": str(tmp_path), "load_inplace": True}]
    assert publisher.served_version == 3
