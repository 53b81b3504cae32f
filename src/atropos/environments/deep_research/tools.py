"""The three tools of a research episode and how a reply's calls are answered.

- `search(query)`: the `top_k` best documents, each `doc_id`, `title` and `snippet`;
- `open(doc_id, page=1)`: the document's text in pages of `page_chars` characters;
- `answer(text, citations=[doc ids])`: the final answer; it ends the episode.

Calls are read as our other tool environments read them (`common.tool_calls.parse_text`:
Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after any think block).
Every call gets a result, in order: a JSON object, or `{"error": "..."}` saying what was wrong
and how to call the tool (a block that is not JSON, an unknown tool, a missing or mistyped
argument, an unknown document, a page past the end, a reply with no call, too many calls).
Nothing the policy writes raises. Each result is cut to `max_result_chars`.

>>> import asyncio
>>> from atropos.environments.deep_research.corpus import Corpus, Document
>>> box = Toolbox(LocalSearch(Corpus([Document("moria", "Moria", "Mithril is mined here.")])))
>>> state = Research()
>>> reply = '<tool_call>{"name": "open", "arguments": {"doc_id": "moira"}}</tool_call>'
>>> print(*asyncio.run(box.respond(reply, state)))
{"error": "unknown doc_id 'moira' (did you mean 'moria'?): open ids from search results"}
>>> state.errors, state.opens
(1, 0)
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from atropos.environments.common.tool_calls import parse_text
from atropos.environments.deep_research.corpus import Corpus, Document, Hit, clip, paged

__all__ = [
    "TOOLS",
    "TOOL_NAMES",
    "Backend",
    "LocalSearch",
    "Research",
    "ToolLimits",
    "Toolbox",
    "closest",
    "tool_error",
]

TOOL_NAMES = ("search", "open", "answer")
CALL_FORMAT = '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>'


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


#: The tools' schemas, OpenAI style (in the system prompt, or the chat template's `tools`).
TOOLS: list[dict[str, Any]] = [
    _function(
        "search",
        "Search the document collection; returns the best documents' ids, titles and snippets.",
        {"query": {"type": "string", "description": "words to search for"}},
        ["query"],
    ),
    _function(
        "open",
        "Read a document found by search, one page at a time.",
        {
            "doc_id": {"type": "string", "description": "a doc_id from search results"},
            "page": {"type": "integer", "description": "page number, from 1 (default 1)"},
        },
        ["doc_id"],
    ),
    _function(
        "answer",
        "Give the final answer with the ids of the documents that support it; ends the task.",
        {
            "text": {"type": "string", "description": "the answer, as short as possible"},
            "citations": {
                "type": "array",
                "items": {"type": "string"},
                "description": "doc_ids of opened documents that support the answer",
            },
        },
        ["text", "citations"],
    ),
]


class Backend(Protocol):
    """Where `search` and `open` look: the local collection or a web search API."""

    async def search(self, query: str, k: int, snippet_chars: int) -> list[Hit]:
        """The `k` best results for `query`."""

    def document(self, doc_id: str) -> Document | None:
        """The document with this id (None: there is none)."""

    def suggest(self, doc_id: str) -> str | None:
        """A known id close to `doc_id` (for the error that names an unknown one), or None."""


class LocalSearch:
    """A `Backend` over a `Corpus` (BM25)."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    async def search(self, query: str, k: int, snippet_chars: int) -> list[Hit]:
        return self.corpus.search(query, k, snippet_chars)

    def document(self, doc_id: str) -> Document | None:
        return self.corpus.get(doc_id)

    def suggest(self, doc_id: str) -> str | None:
        return closest(doc_id, self.corpus.docs)


@dataclass(frozen=True)
class ToolLimits:
    """How much one tool result may show."""

    top_k: int = 5
    snippet_chars: int = 240
    page_chars: int = 2000
    max_result_chars: int = 6000
    max_calls_per_turn: int = 4


@dataclass
class Research:
    """One rollout's use of the tools so far.

    Attributes:
        searches: searches that ran; opens: pages returned.
        errors: tool errors returned (each call or reply that got one).
        opened: ids of the documents the rollout opened.
        answer: the final answer's text (None: not answered yet).
        citations: the ids the answer cited.
    """

    searches: int = 0
    opens: int = 0
    errors: int = 0
    opened: set[str] = field(default_factory=set)
    answer: str | None = None
    citations: tuple[str, ...] = ()


def closest(word: str, known: Iterable[str]) -> str | None:
    """The entry of `known` that `word` begins (the shortest), else the one most like it
    (difflib's cut-off), else None.

    >>> closest("bresk", ["ombre", "bresk-halloway"]), closest("serch", ["search", "open"])
    ('bresk-halloway', 'search')
    """
    names = list(known)
    started = [n for n in names if n.startswith(word)]
    if started:
        return min(started, key=len)
    near = difflib.get_close_matches(word, names, n=1)
    return near[0] if near else None


def tool_error(message: str) -> str:
    """A tool result that reports `message` to the policy."""
    return json.dumps({"error": message}, ensure_ascii=False)


def _text(args: Mapping[str, Any], *names: str) -> str | None:
    """The first of `names` in `args` that is a non-blank string."""
    for name in names:
        value = args.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


class Toolbox:
    """Answers a reply's tool calls against a `Backend`, within `ToolLimits`."""

    def __init__(self, backend: Backend, limits: ToolLimits | None = None) -> None:
        self.backend = backend
        self.limits = limits or ToolLimits()

    async def respond(self, reply: str, state: Research) -> list[str]:
        """The results of the calls in `reply`, in order (an error when it holds none); stops
        after an accepted `answer`."""
        parsed = parse_text(reply)
        results = []
        if parsed.malformed:
            results.append(
                tool_error(
                    f"{parsed.malformed} <tool_call> block(s) could not be read: write each as"
                    f" {CALL_FORMAT} with valid JSON"
                )
            )
        if not parsed.calls and not parsed.malformed:
            results.append(
                tool_error(f"no tool call found: call search, open or answer, e.g. {CALL_FORMAT}")
            )
        most = self.limits.max_calls_per_turn
        for n, call in enumerate(parsed.calls):
            if n == most:
                results.append(tool_error(f"at most {most} calls per reply: the rest were skipped"))
                break
            results.append(await self.call(call["name"], call["arguments"], state))
            if state.answer is not None:
                break
        state.errors += sum(1 for r in results if r.startswith('{"error"'))
        return [clip(r, self.limits.max_result_chars) for r in results]

    async def call(self, name: str, args: Mapping[str, Any], state: Research) -> str:
        """The result of one call."""
        if name == "search":
            return await self._search(args, state)
        if name == "open":
            return self._open(args, state)
        if name == "answer":
            return self._answer(args, state)
        near = closest(name, TOOL_NAMES)
        hint = f" (did you mean {near!r}?)" if near else ""
        return tool_error(f"unknown tool {name!r}{hint}; the tools are search, open and answer")

    async def _search(self, args: Mapping[str, Any], state: Research) -> str:
        query = _text(args, "query", "q")
        if query is None:
            return tool_error('search needs a "query" string: {"query": "words to look for"}')
        limits = self.limits
        hits = await self.backend.search(query, limits.top_k, limits.snippet_chars)
        state.searches += 1
        found: dict[str, Any] = {"query": query, "results": [h.as_dict() for h in hits]}
        if not hits:
            found["note"] = "no document matches; try other words"
        return json.dumps(found, ensure_ascii=False)

    def _open(self, args: Mapping[str, Any], state: Research) -> str:
        doc_id = _text(args, "doc_id", "id")
        if doc_id is None:
            return tool_error('open needs a "doc_id" string from search results')
        page = args.get("page", 1)
        if isinstance(page, str) and page.strip().isdigit():
            page = int(page)
        if not isinstance(page, int) or isinstance(page, bool) or page < 1:
            return tool_error(f'"page" must be a whole number from 1, got {page!r}')
        doc = self.backend.document(doc_id)
        if doc is None:
            return tool_error(self._unknown(doc_id))
        text, pages = paged(doc.text, page, self.limits.page_chars)
        if page > pages:
            return tool_error(f"{doc_id!r} has {pages} page(s); there is no page {page}")
        state.opens += 1
        state.opened.add(doc_id)
        shown: dict[str, Any] = {"doc_id": doc_id, "title": doc.title, "page": page}
        shown |= {"pages": pages, "text": text} | ({"url": doc.url} if doc.url else {})
        return json.dumps(shown, ensure_ascii=False)

    def _unknown(self, doc_id: str) -> str:
        near = self.backend.suggest(doc_id)
        hint = f" (did you mean {near!r}?)" if near else ""
        return f"unknown doc_id {doc_id!r}{hint}: open ids from search results"

    def _answer(self, args: Mapping[str, Any], state: Research) -> str:
        text = _text(args, "text", "answer")
        if text is None:
            return tool_error('answer needs a "text" string: {"text": "...", "citations": [...]}')
        cited = args.get("citations", [])
        if isinstance(cited, str):
            cited = [cited]
        if not isinstance(cited, list) or not all(isinstance(c, str) for c in cited):
            return tool_error('"citations" must be a list of doc_id strings')
        state.answer, state.citations = text, tuple(c.strip() for c in cited)
        return json.dumps({"answer": "recorded"})
