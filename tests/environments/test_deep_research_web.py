"""`deep_research`'s web-search backend against a fake search API that the test serves on
127.0.0.1 (Tavily and Brave shapes, retries, refusals), and a whole episode searching it. No
request ever leaves the machine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from atropos.environments.deep_research import DeepResearch, WebSearch, WebSearchError
from atropos.environments.deep_research.outcome import outcome
from atropos.environments.deep_research.web import web_document
from atropos.net import free_port
from atropos.testing import FakeInferenceServer
from atropos.testing.serve import serve_in_thread

from .helpers import make_env
from .test_deep_research import Q01, Scripted, call

PAGES = [
    {
        "title": "Gannet's Wake - Kestrel Wiki",
        "url": "https://wiki.example/gannets-wake",
        "content": "Gannet's Wake was built in 1198 by the Shipwrights' Guild of Emberlee.",
        "raw_content": "Gannet's Wake was the flagship of Bresk Halloway. She was built in 1198.",
    },
    {"title": "No URL", "content": "skipped"},
    {
        "title": "Bresk Halloway",
        "url": "https://wiki.example/bresk",
        "content": "Admiral Bresk Halloway commanded Gannet's Wake.",
    },
]


@dataclass
class FakeSearchApi:
    """What the fake API saw, and how it misbehaves: `fail` 5xx answers first, or `status`."""

    fail: int = 0
    status: int = 200
    seen: list[dict[str, Any]] = field(default_factory=list)

    async def tavily(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.seen.append({"auth": request.headers.get("authorization"), **body})
        return self._answer({"query": body["query"], "results": PAGES})

    async def brave(self, request: Request) -> JSONResponse:
        token = request.headers.get("x-subscription-token")
        self.seen.append({"token": token, **dict(request.query_params)})
        results = [
            {
                "title": "Saint Orla Light",
                "url": "https://light.example",
                "description": "A lighthouse on Mossgate.",
                "extra_snippets": ["Built in 1275.", "Kept by the Thrush family."],
            }
        ]
        return self._answer({"type": "search", "web": {"results": results}})

    def _answer(self, body: dict[str, Any]) -> JSONResponse:
        if self.fail:
            self.fail -= 1
            return JSONResponse({"detail": "busy"}, status_code=503)
        if self.status != 200:
            return JSONResponse({"detail": "invalid api key"}, status_code=self.status)
        return JSONResponse(body)


@pytest.fixture
def api() -> Iterator[tuple[FakeSearchApi, str]]:
    fake = FakeSearchApi()
    routes = [
        Route("/search", fake.tavily, methods=["POST"]),
        Route("/res/v1/web/search", fake.brave, methods=["GET"]),
    ]
    with serve_in_thread(Starlette(routes=routes)) as url:
        yield fake, url


def search(client: WebSearch, query: str, k: int = 5) -> list[Any]:
    async def main() -> list[Any]:
        try:
            return await client.search(query, k, snippet_chars=40)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_tavily_shape(api):
    fake, url = api
    client = WebSearch("tavily", f"{url}/search", "tvly-secret", backoff=0)
    hits = search(client, "Gannet's Wake", k=5)
    assert fake.seen == [
        {
            "auth": "Bearer tvly-secret",
            "query": "Gannet's Wake",
            "max_results": 5,
            "include_raw_content": True,
        }
    ]
    assert [h.url for h in hits] == [
        "https://wiki.example/gannets-wake",
        "https://wiki.example/bresk",
    ]
    assert hits[0].doc_id.startswith("w-") and len(hits[0].doc_id) == 12
    assert len(hits[0].snippet) <= 40 and hits[0].snippet.endswith("…")
    page = client.document(hits[0].doc_id)
    assert page is not None and page.text == PAGES[0]["raw_content"]  # the full page when given
    assert client.document(hits[1].doc_id).text == PAGES[2]["content"]  # else its snippet
    assert client.suggest(hits[0].doc_id[:-1]) == hits[0].doc_id
    assert client.document("w-0000000000") is None


def test_brave_shape(api):
    fake, url = api
    client = WebSearch("brave", f"{url}/res/v1/web/search", "brave-key", backoff=0)
    [hit] = search(client, "lighthouse Mossgate", k=3)
    assert fake.seen == [{"token": "brave-key", "q": "lighthouse Mossgate", "count": "3"}]
    assert (hit.title, hit.snippet) == ("Saint Orla Light", "A lighthouse on Mossgate.")
    text = client.document(hit.doc_id).text
    assert text == "A lighthouse on Mossgate.\nBuilt in 1275.\nKept by the Thrush family."


def test_busy_answers_are_retried_and_refusals_are_not(api):
    fake, url = api
    fake.fail = 2
    client = WebSearch("tavily", f"{url}/search", "k", retries=3, backoff=0)
    assert len(search(client, "x")) == 2 and len(fake.seen) == 3
    fake.fail, fake.seen[:] = 3, []
    with pytest.raises(WebSearchError, match=r"failed 3 times \(HTTP 503\)"):
        search(WebSearch("tavily", f"{url}/search", "k", retries=3, backoff=0), "x")
    fake.fail, fake.status, fake.seen[:] = 0, 401, []
    with pytest.raises(WebSearchError, match="refused the request: HTTP 401.*check the key"):
        search(WebSearch("tavily", f"{url}/search", "k", retries=3, backoff=0), "x")
    assert len(fake.seen) == 1  # a refusal is not retried
    nowhere = f"http://127.0.0.1:{free_port()}/search"
    with pytest.raises(WebSearchError, match="failed 2 times .*ConnectError"):
        search(WebSearch("tavily", nowhere, "k", retries=2, backoff=0), "x")


def test_a_result_without_url_is_skipped_and_ids_are_stable():
    assert web_document({"title": "x", "content": "y"}) is None
    first, _ = web_document(PAGES[0]) or (None, "")
    again, _ = web_document(dict(PAGES[0], title="renamed")) or (None, "")
    assert first is not None and again is not None and first.id == again.id


make = partial(make_env, DeepResearch)


def test_an_episode_searching_the_web(api, monkeypatch):
    fake, url = api
    monkeypatch.setenv("DR_TEST_SEARCH_KEY", "secret-key")
    page = web_document(PAGES[0])
    assert page is not None
    doc_id = page[0].id
    script = [
        call("search", query="Gannet's Wake built"),
        call("open", doc_id=doc_id),
        call("answer", text="1198", citations=[doc_id]),
    ]
    settings = {"backend": "web", "web_url": f"{url}/search", "web_key_env": "DR_TEST_SEARCH_KEY"}
    with FakeInferenceServer(responder=Scripted(script)) as policy:
        env = make(policy.base_url, group_size=1, **settings)

        async def main() -> Any:
            await env.setup()
            try:
                played = await env.research(Q01)
                return played, await env.outcomes([played])
            finally:
                await env.aclose()

        episode, [scored] = asyncio.run(main())
    assert fake.seen[0]["auth"] == "Bearer secret-key"
    assert episode.stopped == "answered" and episode.research.opened == {doc_id}
    results = json.loads(episode.messages[3]["content"])["results"]
    assert results[0]["url"] == "https://wiki.example/gannets-wake"
    opened = json.loads(episode.messages[5]["content"])
    assert opened["text"] == PAGES[0]["raw_content"] and opened["url"] == PAGES[0]["url"]
    # a web page's id is never one of the question's supporting ids: valid citations count
    assert (scored.reward, scored.citation_recall, scored.citation_precision) == (1.0, None, 1.0)
    assert outcome(episode, "f1", 0.3).reward == 0.7  # compared with them, none would match
    assert "secret-key" not in json.dumps(env.config.model_dump(mode="json"))


def test_the_web_backend_needs_its_key(monkeypatch):
    monkeypatch.delenv("DR_TEST_MISSING_KEY", raising=False)
    env = make(backend="web", web_key_env="DR_TEST_MISSING_KEY")
    with pytest.raises(ValueError, match=r"needs the search API's key in \$DR_TEST_MISSING_KEY"):
        asyncio.run(env.setup())
