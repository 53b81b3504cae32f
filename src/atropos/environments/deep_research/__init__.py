"""`deep_research`: answer questions by searching and reading documents, citing what was read.

The policy plays a multi-turn tool episode, token-exact: `search(query)`, `open(doc_id)` and
`answer(text, citations)` over a shipped corpus (a fictional archipelago, 50 documents, 32
questions), any local collection, a HotpotQA-style hub dataset or a web search API. The answer
is scored by SQuAD's exact match / token F1 (or a judge), scaled by a citation check. Details:
docs/deep_research.md.

Modules: `corpus` (documents, BM25 search, snippets, pages), `questions` (question sets and the
hub loader), `tools` (the three tools and their errors), `web` (the web-search backend),
`episode` (the token-exact turn loop), `scoring` (the reward rules as functions), `outcome` (an
episode's reward and metrics), `judging` (the judge's verdict), `config`, `env`, `demo` (an
offline stand-in policy).
"""

from __future__ import annotations

from atropos.environments.deep_research.config import DeepResearchConfig
from atropos.environments.deep_research.corpus import Corpus, Document, Hit, load_corpus
from atropos.environments.deep_research.demo import demo_responder
from atropos.environments.deep_research.env import DeepResearch, research_group
from atropos.environments.deep_research.episode import Budgets, Episode, play
from atropos.environments.deep_research.outcome import Outcome, outcome
from atropos.environments.deep_research.questions import (
    Question,
    load_hotpot,
    load_questions,
)
from atropos.environments.deep_research.tools import (
    TOOLS,
    LocalSearch,
    Research,
    Toolbox,
    ToolLimits,
)
from atropos.environments.deep_research.web import WebSearch, WebSearchError

__all__ = [
    "TOOLS",
    "Budgets",
    "Corpus",
    "DeepResearch",
    "DeepResearchConfig",
    "Document",
    "Episode",
    "Hit",
    "LocalSearch",
    "Outcome",
    "Question",
    "Research",
    "ToolLimits",
    "Toolbox",
    "WebSearch",
    "WebSearchError",
    "demo_responder",
    "load_corpus",
    "load_hotpot",
    "load_questions",
    "outcome",
    "play",
    "research_group",
]
