"""`NPCArena`: one policy plays many game characters, rewarded by an AI judge (RLAIF).

Each item is a character and a player's line. The character's whole sheet and the lore the
retriever finds for the line (game events included) form the system prompt; the policy answers
through the managed server, so the trained tokens are exactly the prompt it saw. The judge
(`--judge.*`, the policy's servers by default) sees the sheet, the lore, the line and the
responses, and judges a pair in both orders (`judge_mode: pairwise`) or rates each response on
a 1-10 rubric (`judge_mode: rubric`). Choices, metrics and the data format: docs/npc_arena.md.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, ClassVar

from atropos.environments.common.data_loading import data_path
from atropos.environments.common.retrieval import LoreDoc, make_retriever
from atropos.environments.npc_arena import lines, prompts
from atropos.environments.npc_arena.characters import CharacterSheet, load_characters
from atropos.environments.npc_arena.config import NPCArenaConfig
from atropos.environments.npc_arena.lore import EventFeed, LoreIndex, load_lore
from atropos.environments.npc_arena.scoring import CriterionTally, cut_scores, rubric_score
from atropos.envs.judge import JudgedEnv, compare, rate
from atropos.envs.simple import Env, Rollout, rollout_group
from atropos.envs.types import Message, ScoredDataGroup
from atropos.inference.tokenize import template_ids

__all__ = ["COUNTERS", "NPCArena"]

COUNTERS = (
    "judged_groups",  # groups the judge scored (its answers parsed or not)
    "votes_parsed",
    "votes_unparsed",
    "truncation_decided",  # pairwise: exactly one response cut at max_tokens, no judge call
    "dropped_all_truncated",
    "dropped_unparsed",  # the judge gave no usable answer for a response: no made-up score
    "skipped_long_prompts",  # the sheet alone leaves no room for the response
    "lore_trimmed",  # prompts that lost lore documents to fit max_token_length
)
RUBRIC_LOW, RUBRIC_HIGH = 1, 10  # the rubric's scale


class NPCArena(Env[NPCArenaConfig], JudgedEnv):
    """Play the character of the sheet, judged on consistency, lore accuracy and engagingness."""

    name = "npc_arena"
    config_defaults: ClassVar[dict[str, Any]] = {
        "max_token_length": 2048,
        "use_wandb": False,
        "judge": {"max_tokens": 1024},  # sheet, lore and a pair fit in 4096 with it
    }
    temperature = 1.0

    @property
    def counts(self) -> Counter[str]:
        """Counters since the start (names in `COUNTERS`)."""
        return self.__dict__.setdefault("_counts", Counter())  # type: ignore[no-any-return]

    @property
    def tally(self) -> CriterionTally:
        """Per-criterion judge statistics since the start."""
        return self.__dict__.setdefault("_tally", CriterionTally())  # type: ignore[no-any-return]

    def arena_metrics(self) -> dict[str, float]:
        """Counters and per-criterion statistics as `train/npc_arena/...`."""
        prefix = "train/npc_arena/"
        out = {f"{prefix}{k}": float(self.counts[k]) for k in COUNTERS}
        index: LoreIndex | None = self.__dict__.get("lore")
        if index is not None and index.feed is not None:
            out[f"{prefix}events_indexed"] = float(len(index.events))
            out[f"{prefix}events_bad_lines"] = float(index.feed.bad)
        return {**out, **self.tally.metrics(prefix)}

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        await super().wandb_log({**(metrics or {}), **self.arena_metrics()})

    # ----- data -----------------------------------------------------------------------------

    async def setup(self) -> None:
        s = self.config
        self.characters: dict[str, CharacterSheet] = load_characters(
            s.characters_dir or data_path("npc_arena", "characters")
        )
        docs = load_lore(s.lore_dir or data_path("npc_arena", "lore"))
        feed = EventFeed(s.events_path) if s.events_path else None
        self.lore = LoreIndex(make_retriever(s.retriever, s.embedding_model), docs, feed)
        await super().setup()

    def load(self) -> list[dict[str, str]]:
        s = self.config
        rows, where = lines.load_rows(
            s.player_lines_path, s.player_lines_dataset, s.player_lines_split
        )
        return lines.to_items(rows, self.characters, where, s.line_field, s.character_field)

    def retrieve(self, item: dict[str, str]) -> list[LoreDoc]:
        """The lore for `item`: the best documents for the line and the character's name, and
        the latest events."""
        query = f"{item['line']} {self.characters[item['character']].name}"
        return self.lore.lookup(query, self.config.lore_k, self.config.recent_events)

    def prompt(self, item: Any) -> list[Message]:
        return prompts.policy_messages(
            self.characters[item["character"]], self.retrieve(item), item["line"]
        )

    def fit(self, item: dict[str, str], lore: list[LoreDoc]) -> tuple[list[Message], int] | None:
        """The prompt with as much of `lore` as leaves `response_tokens` of room in
        max_token_length (least relevant dropped first), and how many documents it kept."""
        sheet, room = self.characters[item["character"]], self.config.max_token_length
        room -= self.config.response_tokens
        for kept in range(len(lore), -1, -1):
            messages = prompts.policy_messages(sheet, lore[:kept], item["line"])
            if len(template_ids(self.tokenizer, messages, add_generation_prompt=True)) <= room:
                return messages, kept
        return None

    def score(self, item: Any, completion: str) -> float:
        raise NotImplementedError("npc_arena judges whole groups: see NPCArena.judge_group")

    # ----- rollouts and judging ---------------------------------------------------------------

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        lore = self.retrieve(item)
        fitted = self.fit(item, lore)
        if fitted is None:
            self.counts["skipped_long_prompts"] += 1
            self.drop("prompt_too_long")
            return None, []
        messages, kept = fitted
        self.counts["lore_trimmed"] += kept < len(lore)
        s = self.config
        rollouts = await self.generate(messages, s.group_size, max_tokens=s.response_tokens)
        scores = await self.judge_group(item, lore[:kept], rollouts)
        if scores is None:
            return None, []
        return rollout_group(rollouts, [messages] * len(rollouts), scores), []

    async def judge_group(
        self, item: dict[str, str], lore: list[LoreDoc], rollouts: list[Rollout]
    ) -> list[float] | None:
        """The group's scores (truncation rules first, then the judge); None drops it."""
        reasons = [r.finish_reason for r in rollouts]
        if all(reason == "length" for reason in reasons):
            self.counts["dropped_all_truncated"] += 1
            self.drop("truncated")
            return None
        sheet = self.characters[item["character"]]
        if self.config.judge_mode == "pairwise":
            decided = cut_scores(reasons)
            if decided is not None:
                self.counts["truncation_decided"] += 1
                return decided
            return await self._judge_pair(sheet, lore, item["line"], rollouts)
        return await self._judge_rubric(sheet, lore, item["line"], rollouts)

    async def _judge_pair(
        self, sheet: CharacterSheet, lore: list[LoreDoc], line: str, rollouts: list[Rollout]
    ) -> list[float] | None:
        a, b = (r.text for r in rollouts)
        verdict = await compare(
            self.judge, lambda x, y: prompts.pair_messages(sheet, lore, line, x, y), a, b
        )
        self.counts["judged_groups"] += 1
        self.counts["votes_parsed"] += verdict.parsed
        self.counts["votes_unparsed"] += verdict.unparsed
        self.tally.add_pair(verdict.answers, len(verdict.answers) // 2, verdict.scores)
        if verdict.scores is None:
            self.counts["dropped_unparsed"] += 1
            self.drop("no_judge_vote")
            return None
        return list(verdict.scores)

    async def _judge_rubric(
        self, sheet: CharacterSheet, lore: list[LoreDoc], line: str, rollouts: list[Rollout]
    ) -> list[float] | None:
        judged = [r for r in rollouts if r.finish_reason != "length"]
        verdicts = await asyncio.gather(
            *(
                rate(
                    self.judge,
                    prompts.rubric_messages(sheet, lore, line, r.text, RUBRIC_LOW, RUBRIC_HIGH),
                    prompts.CRITERIA,
                    low=RUBRIC_LOW,
                    high=RUBRIC_HIGH,
                )
                for r in judged
            )
        )
        self.counts["judged_groups"] += 1
        self.counts["votes_parsed"] += sum(v.parsed for v in verdicts)
        self.counts["votes_unparsed"] += sum(v.unparsed for v in verdicts)
        for verdict in verdicts:
            if verdict.means is not None:
                self.tally.add_rating(verdict.means)
        if any(v.means is None for v in verdicts):
            self.counts["dropped_unparsed"] += 1
            self.drop("no_judge_vote")
            return None
        rated = iter(verdicts)
        scores = []
        for r in rollouts:  # a cut response scores the bottom of the scale, unjudged
            means = None if r.finish_reason == "length" else next(rated).means
            scores.append(-1.0 if means is None else rubric_score(means, RUBRIC_LOW, RUBRIC_HIGH))
        return scores
