"""`TrainerClient.published`: said after each sync; an API without the route is told once."""

from __future__ import annotations

import logging

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from atropos.api import create_app
from atropos.testing import serve_in_thread
from atropos.trainer.client import TrainerClient


def test_published_reaches_the_api():
    with serve_in_thread(create_app()) as url:
        client = TrainerClient(url, patience=5)
        client.published(4)
        client.close()
        assert httpx.get(f"{url}/status").json()["policy_version"] == 4


def test_an_api_without_the_route_is_asked_once_and_logged_once(caplog):
    calls: list[str] = []

    async def status(request):  # atroposlib's API: no /policy_version (Starlette's 404)
        calls.append(request.url.path)
        return JSONResponse({"current_step": 0, "queue_size": 0})

    app = Starlette(routes=[Route("/status", status)])
    with serve_in_thread(app) as url, caplog.at_level(logging.WARNING, "atropos.trainer"):
        client = TrainerClient(url, patience=5)
        for version in range(3):
            client.published(version)
        client.close()
    said = [r for r in caplog.records if "/policy_version" in r.getMessage()]
    assert len(said) == 1 and not client.takes_versions
