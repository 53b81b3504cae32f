"""`atropos.client`'s API calls, sync and async, against the real API app served in a thread:
register, lease and acknowledge, `published` (and an API without the route), the environment
`atropos launch` sets, and an import that never loads torch."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from atropos.api import create_app
from atropos.client import ApiError, AsyncTrainerClient, TrainerClient
from atropos.testing import serve_in_thread

REGISTRATION = dict(
    wandb_group="", wandb_project="", batch_size=2, max_token_len=64, checkpoint_dir="/tmp/c",
    save_checkpoint_interval=1, starting_step=0, num_steps=3,
)  # fmt: skip


def push(url: str, n: int = 1) -> None:
    group = {"tokens": [[1, 2, 3], [1, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]],
             "scores": [1.0, 0.0]}  # fmt: skip
    assert httpx.post(f"{url}/scored_data_list", json=[group] * n).status_code == 200


def queue(url: str) -> int:
    return int(httpx.get(f"{url}/status").json()["queue_size"])


def test_importing_the_client_loads_no_torch() -> None:
    code = "import sys, atropos.client; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_lease_ack_and_published() -> None:
    with serve_in_thread(create_app()) as url, TrainerClient(url, patience=5) as client:
        client.wait_ready()
        assert isinstance(client.register(**REGISTRATION), int)
        assert client.next_batch(lease=30, within=0.2) is None  # nothing yet
        push(url, 2)
        batch = client.next_batch(lease=30)
        assert batch is not None and batch.step == 1 and batch.batch_id
        assert [g.scores for g in batch.groups] == [[1.0, 0.0]]
        assert queue(url) == 2  # leased, not yet acknowledged
        client.ack(batch.batch_id)
        client.ack(batch.batch_id)  # a retried ack is no error
        assert queue(url) == 1
        with pytest.raises(ApiError, match="404"):
            client.ack("0" * 32)
        client.ack("0" * 32, missing_ok=True)
        client.published(4)
        assert httpx.get(f"{url}/status").json()["policy_version"] == 4


def test_the_async_client_does_the_same() -> None:
    async def run(url: str) -> tuple[int, list[float], int]:
        async with AsyncTrainerClient(url, patience=5) as client:
            await client.wait_ready()
            await client.register(**REGISTRATION)
            assert await client.next_batch(lease=30, within=0.2) is None
            push(url)
            batch = await client.next_batch(lease=30)
            assert batch is not None and batch.batch_id
            before = queue(url)
            await client.ack(batch.batch_id)
            await client.published(3)
            return before, batch.groups[0].scores, queue(url)

    with serve_in_thread(create_app()) as url:
        assert asyncio.run(run(url)) == (1, [1.0, 0.0], 0)
        assert httpx.get(f"{url}/status").json()["policy_version"] == 3


def test_the_api_and_servers_come_from_launchs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATROPOS_API_URL", "http://127.0.0.1:1/")
    monkeypatch.setenv("ATROPOS_TRAIN_API_KEY", "k")
    monkeypatch.setenv("ATROPOS_SERVER_URLS", "http://a:1/v1, http://b:2/v1")
    with TrainerClient() as client:
        assert client.url == "http://127.0.0.1:1"
        assert client.http.headers["Authorization"] == "Bearer k"
        assert client.publisher.urls == ["http://a:1/v1", "http://b:2/v1"]
        assert client.publisher.mode == "reload"


def test_an_unreachable_api_fails_after_the_patience() -> None:
    from atropos.net import free_port

    with TrainerClient(f"http://127.0.0.1:{free_port()}", patience=0.3) as client:
        with pytest.raises(ApiError, match="still failing after"):
            client.wait_ready()


def test_an_api_without_the_route_is_asked_once_and_logged_once(caplog):
    calls: list[str] = []

    async def status(request):  # atroposlib's API: no /policy_version (Starlette's 404)
        calls.append(request.url.path)
        return JSONResponse({"current_step": 0, "queue_size": 0})

    app = Starlette(routes=[Route("/status", status)])
    with serve_in_thread(app) as url, caplog.at_level(logging.WARNING, "atropos.client"):
        client = TrainerClient(url, patience=5)
        for version in range(3):
            client.published(version)
        client.close()
    said = [r for r in caplog.records if "/policy_version" in r.getMessage()]
    assert len(said) == 1 and not client.takes_versions
