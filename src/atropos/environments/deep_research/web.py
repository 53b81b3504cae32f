"""The optional web-search backend: a Tavily- or Brave-style HTTP search API behind a user's key.

`search` sends the query to the API and keeps each result as a document the policy can `open`
(its id `w-` and 10 hex digits of the URL's SHA-1, stable across runs); the page text is the
result's full content when the API returns it (Tavily's `raw_content`), else its snippets. No
page is fetched from the web by us: `open` reads what the search returned.

- `tavily`: `POST {url}` with `{"query", "max_results", "include_raw_content": true}` and
  `Authorization: Bearer KEY`; results under `results` (`title`, `url`, `content`,
  `raw_content`).
- `brave`: `GET {url}?q=...&count=k` with `X-Subscription-Token: KEY`; results under
  `web.results` (`title`, `url`, `description`, `extra_snippets`).

Connection errors, 429 and 5xx answers are retried (`retries` tries in all, backing off); any
other failure raises `WebSearchError`, which fails the rollout (counted by the runner, never a
reward of 0).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from typing import Any, Literal

import httpx

from atropos.environments.deep_research.corpus import Document, Hit, clip
from atropos.environments.deep_research.tools import closest

__all__ = ["WEB_APIS", "WebSearch", "WebSearchError", "web_document"]

WebApi = Literal["tavily", "brave"]
WEB_APIS: dict[str, str] = {  # api -> its default search URL
    "tavily": "https://api.tavily.com/search",
    "brave": "https://api.search.brave.com/res/v1/web/search",
}


class WebSearchError(RuntimeError):
    """The search API could not answer (after retries where retrying made sense): the
    rollout is `failed/web_search` (`atropos.envs.outcome`)."""

    failure_kind = "web_search"


def web_document(result: dict[str, Any]) -> tuple[Document, str] | None:
    """(the document, its snippet) of one Tavily or Brave result; None without a URL."""
    url = result.get("url")
    if not isinstance(url, str) or not url:
        return None
    extra = result.get("extra_snippets") or []
    short = str(result.get("content") or result.get("description") or "")
    text = result.get("raw_content") or "\n".join([short, *map(str, extra)]).strip()
    ident = "w-" + hashlib.sha1(url.encode()).hexdigest()[:10]
    return Document(ident, str(result.get("title") or url), str(text), url), short


class WebSearch:
    """Search through an HTTP API; the documents it returned stay openable (the newest
    `max_docs`).

    Args:
        api: "tavily" or "brave": the shape of the request and answer.
        url: the search endpoint.
        key: the API key (from the environment variable the config names).
        timeout: seconds one request may take.
        retries: tries in all for retryable failures.
        backoff: seconds before the second try, doubling after.
    """

    def __init__(
        self,
        api: WebApi,
        url: str,
        key: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 1.0,
        max_docs: int = 10_000,
    ) -> None:
        if api not in WEB_APIS:
            raise ValueError(f"unknown web API {api!r}; choose from {sorted(WEB_APIS)}")
        self.api, self.url, self._key = api, url, key
        self.retries, self.backoff, self.max_docs = max(1, retries), backoff, max_docs
        self._client = httpx.AsyncClient(timeout=timeout)
        self._docs: OrderedDict[str, Document] = OrderedDict()

    def document(self, doc_id: str) -> Document | None:
        """A document a search returned, or None."""
        return self._docs.get(doc_id)

    def suggest(self, doc_id: str) -> str | None:
        """The id of a kept document most like `doc_id`, or None."""
        return closest(doc_id, self._docs)

    async def search(self, query: str, k: int, snippet_chars: int) -> list[Hit]:
        """The API's first `k` results for `query`."""
        answer = await self._ask(query, k)
        found = answer.get("results") if self.api == "tavily" else answer.get("web", {})
        if isinstance(found, dict):
            found = found.get("results")
        hits = []
        for result in found if isinstance(found, list) else []:
            made = web_document(result) if isinstance(result, dict) else None
            if made is None:
                continue
            doc, short = made
            self._keep(doc)
            hits.append(Hit(doc.id, doc.title, clip(short, snippet_chars), doc.url))
        return hits[:k]

    def _keep(self, doc: Document) -> None:
        self._docs[doc.id] = doc
        self._docs.move_to_end(doc.id)
        while len(self._docs) > self.max_docs:
            self._docs.popitem(last=False)

    def _request(self, query: str, k: int) -> httpx.Request:
        if self.api == "tavily":
            body = {"query": query, "max_results": k, "include_raw_content": True}
            headers = {"Authorization": f"Bearer {self._key}"}
            return self._client.build_request("POST", self.url, json=body, headers=headers)
        headers = {"X-Subscription-Token": self._key, "Accept": "application/json"}
        params: dict[str, str | int] = {"q": query, "count": k}
        return self._client.build_request("GET", self.url, params=params, headers=headers)

    async def _ask(self, query: str, k: int) -> dict[str, Any]:
        """The API's JSON answer, retried on connection errors, 429 and 5xx."""
        problem = ""
        for attempt in range(self.retries):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await self._client.send(self._request(query, k))
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                problem = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise WebSearchError(
                    f"the {self.api} search API at {self.url} refused the request: HTTP"
                    f" {response.status_code} {clip(response.text, 200)} (check the key)"
                )
            try:
                answer = response.json()
            except ValueError:
                raise WebSearchError(f"the {self.api} search API answered non-JSON") from None
            return answer if isinstance(answer, dict) else {}
        raise WebSearchError(
            f"the {self.api} search API at {self.url} failed {self.retries} times ({problem})"
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
