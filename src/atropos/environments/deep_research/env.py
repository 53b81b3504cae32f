"""`DeepResearch`: the environment: data and search backend at setup, groups of research
episodes, evaluation.

A group is `group_size` episodes of one question, each in its own token-exact session
(`episode.play`), scored by `outcome.outcome` (answer and citations) and, with
`--env.answer_metric judge`, the judge's verdicts (`judging.py`). Per-item metrics (em, f1,
citation precision and recall, searches, opens, turns, tool errors) are logged as
`train/<metric>` means and `eval/<metric>` in evaluations.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from atropos.environments.common.multiturn import node_group, require_token_servers
from atropos.environments.deep_research.config import DeepResearchConfig
from atropos.environments.deep_research.corpus import Corpus, Document, load_corpus
from atropos.environments.deep_research.episode import Budgets, Episode, play, system_prompt
from atropos.environments.deep_research.judging import verdict
from atropos.environments.deep_research.outcome import Outcome, columns, means, outcome
from atropos.environments.deep_research.questions import (
    Question,
    load_hotpot,
    load_questions,
    shipped_corpus_path,
)
from atropos.environments.deep_research.tools import Backend, LocalSearch, Toolbox, ToolLimits
from atropos.environments.deep_research.web import WEB_APIS, WebSearch
from atropos.envs.base import BaseEnv
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.judge import JudgedEnv
from atropos.envs.outcome import truncated, with_outcomes
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup

__all__ = ["DeepResearch", "research_group"]


def research_group(episodes: Sequence[Episode], scores: Sequence[float]) -> ScoredDataGroup:
    """The group of played episodes (`common.multiturn.node_group`): each one's token-exact
    sequence (replies trained, prompt and tool results masked), the server's logprobs and the
    conversation its tokens hold."""
    nodes = [e.node for e in episodes if e.node is not None and e.node.messages]
    if len(nodes) != len(episodes):
        raise ValueError("every episode of a group needs at least one reply")
    return node_group(nodes, scores, [n.messages for n in nodes])


class DeepResearch(JudgedEnv, BaseEnv[DeepResearchConfig]):
    """Answer questions by searching and reading a document collection, citing what was read."""

    name = "deep_research"
    config: DeepResearchConfig  # (JudgedEnv comes first among the bases, for the MRO)
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 8192, "use_wandb": False
    }  # fmt: skip
    seed: ClassVar[int] = 0

    # ----- data and backend ---------------------------------------------------------------------

    def load(self) -> tuple[list[Document], list[Question], list[Question]]:
        """(documents, training questions, held-out questions) under the current settings; no
        documents for the web backend unless a hub dataset brings them."""
        s = self.config
        if s.dataset_name:
            limit = s.hub_limit or None
            docs, train = load_hotpot(s.dataset_name, s.dataset_config, "train", limit)
            more, test = load_hotpot(s.dataset_name, s.dataset_config, "test", limit)
            known = {d.id for d in docs}
            return [*docs, *(d for d in more if d.id not in known)], train, test
        train = load_questions("train", s.questions, s.test_fraction)
        test = load_questions("test", s.questions, s.test_fraction)
        if s.backend == "web":
            return [], train, test
        return load_corpus(s.corpus or shipped_corpus_path()), train, test

    def backend(self, docs: list[Document], questions: Sequence[Question]) -> Backend:
        """The search backend: the local corpus (every supporting id checked against it) or
        the web search API with the key from `$web_key_env`."""
        s = self.config
        if s.backend == "local":
            corpus = Corpus(docs)
            missing = [(q.id, d) for q in questions for d in q.supporting if corpus.get(d) is None]
            if missing:
                (qid, doc), n = missing[0], len(missing)
                raise ValueError(
                    f"{n} supporting id(s) of the questions are not in the corpus, e.g. {doc!r} of"
                    f" question {qid!r}: a question's 'supporting' must name the corpus' ids"
                )
            return LocalSearch(corpus)
        key = os.environ.get(s.web_key_env, "")
        if not key:
            raise ValueError(
                f"--env.backend web needs the search API's key in ${s.web_key_env}: set it, or"
                " name another variable with --env.web_key_env"
            )
        web = WebSearch(s.web_api, s.web_url or WEB_APIS[s.web_api], key, s.web_timeout)
        self.on_close(web.aclose)
        return web

    async def setup(self) -> None:
        require_token_servers(self)
        s = self.config
        docs, self.questions, self.test_questions = self.load()
        if not self.questions:
            raise ValueError("deep_research: no training questions")
        limits = ToolLimits(
            s.top_k, s.snippet_chars, s.page_chars, s.max_tool_result_chars, s.max_calls_per_turn
        )
        every = [*self.questions, *self.test_questions]
        self.toolbox = Toolbox(self.backend(docs, every), limits)
        self.system = system_prompt(s.max_turns, list_tools=not s.native_tools)
        self._passes = ShuffledPasses(self.questions, self.seed)

    async def get_next_item(self) -> Item:
        return self._passes.next()

    # ----- rollouts -----------------------------------------------------------------------------

    async def research(
        self, question: Question, split: str = "train", temperature: float | None = None
    ) -> Episode:
        """One episode of `question` in its own token-exact session."""
        s = self.config
        budgets = Budgets(
            s.max_turns,
            s.max_reply_tokens,
            s.max_episode_tokens,
            s.max_token_length,
            s.max_tool_calls,
            s.max_seconds,
        )
        tokenizer = self.tokenizer  # before the servers, so they share it
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            return await play(
                session,
                question,
                self.toolbox,
                budgets,
                system=self.system,
                tool_role=s.tool_role,
                native_tools=s.native_tools,
                split=split,
                temperature=s.temperature if temperature is None else temperature,
            )

    async def outcomes(self, episodes: Sequence[Episode]) -> list[Outcome] | None:
        """The episodes' outcomes; None (the group dropped as `no_judge_vote`) when the judge
        gave no parsable vote on an answer."""
        s = self.config
        verdicts: list[float | None] = [None] * len(episodes)
        if s.answer_metric == "judge":
            answered = [(i, e) for i, e in enumerate(episodes) if e.research.answer is not None]
            found = await asyncio.gather(
                *(verdict(self.judge, e.question, e.research.answer or "") for _, e in answered)
            )
            for (i, _), (share, unparsed) in zip(answered, found, strict=True):
                self.record_mean("train/judge_unparsed", [float(unparsed)])
                if share is None:
                    self.drop("no_judge_vote")
                    return None
                verdicts[i] = share
        local = s.backend == "local"  # a web page's id is never a supporting id
        return [
            outcome(e, s.answer_metric, s.citation_weight, v, supporting=local)
            for e, v in zip(episodes, verdicts, strict=True)
        ]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        question: Question = item
        episodes = await asyncio.gather(
            *(self.research(question) for _ in range(self.config.group_size))
        )
        if any(e.node is None for e in episodes):  # the question alone does not fit
            self.drop("prompt_too_long")
            return None, []
        found = await self.outcomes(episodes)
        if found is None:
            return None, []
        for key, values in columns(found).items():
            self.record_mean(f"train/{key}", values)
        rule = self.config.truncated
        entries = [truncated(e.limit, rule) if e.limit else {} for e in episodes]
        return with_outcomes(research_group(episodes, [o.reward for o in found]), entries), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per held-out question at `eval_temperature` (0: greedy); logs the means
        of the per-item metrics as `eval/<metric>` and one sample row per question.

        `envs.evaluation.evaluate_each`, not `Env.evaluate`: an item is a conversation of
        many turns. A question the judge gives no vote on is left out."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.max_reply_tokens}
        questions = self.test_questions[: s.eval_limit or None]
        return await evaluate_each(self, questions, self._eval_play, _eval_report, params)

    async def _eval_play(self, question: Question) -> tuple[Episode, Outcome] | None:
        episode = await self.research(question, "eval", self.config.eval_temperature)
        found = await self.outcomes([episode])
        return (episode, found[0]) if found else None


def _eval_report(played: list[tuple[Question, tuple[Episode, Outcome]]]) -> Report:
    """The means of the per-item metrics as `eval/<metric>`, and a sample row per question."""
    return means([o for _, (_, o) in played], "eval"), [sample(e, o) for _, (e, o) in played]


def sample(episode: Episode, found: Outcome) -> dict[str, Any]:
    """The row of `samples.jsonl` for one evaluated episode."""
    question, research = episode.question, episode.research
    return {
        "id": question.id,
        "question": question.question,
        "answers": list(question.answers),
        "supporting": list(question.supporting),
        "answer": research.answer,
        "citations": list(research.citations),
        "stopped": episode.stopped,
        "score": found.reward,
        **found.metrics(),
        "messages": episode.messages,
    }
