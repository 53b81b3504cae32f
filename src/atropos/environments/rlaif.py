"""`rlaif`: steer a policy toward a free-text preference, scored by an AI judge (RLAIF).

Items are chat conversations cut before their final assistant reply (the shipped WildChat-like
fixture, or `--env.dataset_name allenai/WildChat`). Each gives a pair of completions; in
`injection_rate` of items one of the pair is drawn with the preference as its system prompt.
A pair is scored by truncation when exactly one completion hit max_tokens (+1 finished, -1 cut),
else by the judge (`atropos.envs.judge.compare`, both orders) as centred vote shares in
[-0.5, 0.5]. No evaluation (as upstream). Choices and metrics: docs/rlaif.md.

>>> prompt_turns([{"role": "user", "content": "hi", "lang": "en"},
...               {"role": "assistant", "content": "hello"}])
[{'role': 'user', 'content': 'hi'}]
>>> truncation_scores(["stop", "length"]), truncation_scores(["stop", "stop"])
([1.0, -1.0], None)
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field, field_validator

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeConfig, JudgedEnv, compare
from atropos.envs.simple import Env, Rollout, rollout_group
from atropos.envs.types import Message, ScoredDataGroup
from atropos.inference.tokenize import template_ids

__all__ = [
    "COUNTERS",
    "DEFAULT_PREFERENCE",
    "RLAIF",
    "RLAIFConfig",
    "demo_responder",
    "judge_messages",
    "prompt_turns",
    "to_item",
    "truncation_scores",
]

DEFAULT_PREFERENCE = (
    "Answer like the ghost of an old lighthouse keeper on a foggy coast: wistful and courteous,"
    " fond of tides, lamplight and gulls, drifting into sea-soaked metaphors. Keep whatever"
    " substance the answer needs, but let the mood be haunted and gentle, never gruesome. We are"
    " steering the voice here, not the instruction following."
)
STEER_PREFIX = "Whatever the conversation says, the people training you ask you to answer so:\n"
JUDGE_SYSTEM = (
    "You judge which of two replies better fits a requested style. Think it over first (inside"
    " <think> </think> tags if you like), then end with your choice written as \\boxed{A} or"
    " \\boxed{B}. An answer without a boxed letter is not counted."
)
JUDGE_PROMPT = """[Conversation]
{conversation}

[Response A]
{first}

[Response B]
{second}

[Preference]
{preference}

Above are a conversation and two candidate replies to its last turn. An assistant is being \
trained, with rewards from you, to answer the way the preference describes. Pick the reply that \
would move it further that way if rewarded, even if only a little; how well a reply follows the \
request does not matter here. Reason it through, then answer \\boxed{{A}} or \\boxed{{B}}."""
COUNTERS = (
    "judged_pairs",  # pairs the judge scored (its verdict parsed or not)
    "votes_parsed",
    "votes_unparsed",
    "truncation_decided",  # exactly one completion cut at max_tokens: no judge call
    "dropped_both_truncated",
    "dropped_unparsed",  # the judge gave no parseable vote: no made-up score
    "skipped_long_prompts",  # prompt >= 1.5 * max_token_length tokens
    "steered_pairs",  # scored pairs whose first completion saw the preference
    "steered_preferred",  # ... and scored higher than the plain one
)
_ROLES = ("system", "user", "assistant")


def prompt_turns(conversation: Sequence[Mapping[str, Any]]) -> list[Message]:
    """The turns to complete: role and content only, without the trailing assistant reply (and
    a second trailing assistant turn too, as upstream)."""
    turns: list[Message] = [{"role": str(t["role"]), "content": t["content"]} for t in conversation]
    for _ in range(2):
        if turns and turns[-1]["role"] == "assistant":
            turns.pop()
    return turns


def to_item(row: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """An item (`messages`) from a row's `conversation`; None when no user turn is left last.

    Raises:
        ValueError: the row has no `conversation` list, or a turn lacks a known role or text.
    """
    conversation = row.get("conversation")
    if not isinstance(conversation, list):
        raise ValueError(
            f"{where}: expected a 'conversation' list, got {type(conversation).__name__}"
        )
    for turn in conversation:
        if not isinstance(turn, Mapping) or turn.get("role") not in _ROLES:
            raise ValueError(f"{where}: each turn needs a role in {_ROLES}, got {turn!r:.80}")
        if not isinstance(turn.get("content"), str):
            raise ValueError(f"{where}: turn content must be a string, got {turn!r:.80}")
    turns = prompt_turns(conversation)
    return {"messages": turns} if turns and turns[-1]["role"] == "user" else None


def truncation_scores(finish_reasons: Sequence[str]) -> list[float] | None:
    """+1 per finished completion and -1 per one cut at max_tokens ("length") when some but not
    all were cut; None otherwise (none cut: the judge decides; all cut: the group is dropped)."""
    cut = [reason == "length" for reason in finish_reasons]
    if all(cut) or not any(cut):
        return None
    return [-1.0 if c else 1.0 for c in cut]


def judge_messages(
    conversation: Sequence[Message], first: str, second: str, preference: str
) -> list[Message]:
    """The judge's request: the conversation, both replies and the preference."""
    shown = "\n".join(f"{m['role']}: {m['content']}" for m in conversation)
    text = JUDGE_PROMPT.format(
        conversation=shown, first=first, second=second, preference=preference
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": text}]


class RLAIFConfig(BaseEnvConfig):
    """`rlaif`'s settings; the judge is configured with `--judge.*`."""

    group_size: int = Field(default=2, description="completions per item: a pair, always 2")
    preference: str = Field(
        default=DEFAULT_PREFERENCE, min_length=1, description="the behaviour to steer toward"
    )
    injection_rate: float = Field(
        default=0.05, ge=0, le=1, description="share of items with one completion steered"
    )
    dataset_name: str | None = Field(
        default=None, description="hub dataset, e.g. allenai/WildChat (unset: shipped fixture)"
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig)

    @field_validator("group_size")
    @classmethod
    def _pairs(cls, v: int) -> int:
        if v != 2:
            raise ValueError(f"rlaif judges pairs: group_size must be 2, got {v}")
        return v


class RLAIF(Env[RLAIFConfig], JudgedEnv):
    """Pairs of completions, judged against `preference` (or decided by truncation)."""

    name = "rlaif"
    config_defaults: ClassVar[dict[str, Any]] = {"max_token_length": 1024, "use_wandb": False}
    temperature = 1.0

    @property
    def counts(self) -> Counter[str]:
        """Counters since the start (names in `COUNTERS`)."""
        return self.__dict__.setdefault("_counts", Counter())  # type: ignore[no-any-return]

    def judge_metrics(self) -> dict[str, float]:
        """The counters as `train/rlaif/<name>`, plus `dropped_groups` (both drop reasons)."""
        out = {f"train/rlaif/{k}": float(self.counts[k]) for k in COUNTERS}
        dropped = self.counts["dropped_both_truncated"] + self.counts["dropped_unparsed"]
        return {**out, "train/rlaif/dropped_groups": float(dropped)}

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        await super().wandb_log({**(metrics or {}), **self.judge_metrics()})

    def load(self) -> list[dict[str, Any]]:
        name = self.config.dataset_name
        if not name:
            path = data_path("rlaif", "train.jsonl")
            found = [to_item(r, f"{path} row {n}") for n, r in enumerate(read_jsonl(path), 1)]
        else:
            found = []
            for n, row in enumerate(load_hub(name, "train")):
                try:
                    found.append(to_item(row, f"{name} row {n}"))
                except ValueError:  # a malformed hub row is skipped, not fatal
                    continue
        return [item for item in found if item is not None]

    async def setup(self) -> None:
        await super().setup()
        self._inject_rng = random.Random(self.seed + 1)  # which items get the preference

    def prompt(self, item: Any) -> list[Message]:
        return [{"role": m["role"], "content": m["content"]} for m in item["messages"]]

    def score(self, item: Any, completion: str) -> float:
        raise NotImplementedError("rlaif scores pairs, not completions: see RLAIF.score_pair")

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        s, plain = self.config, self.prompt(item)
        steered = self._inject_rng.random() < s.injection_rate
        prompts: list[list[Message]] = [plain, plain]
        if steered:  # the preference replaces any system turn; the plain reply sees none either
            plain = [m for m in plain if m["role"] != "system"]
            prompts = [[{"role": "system", "content": STEER_PREFIX + s.preference}, *plain], plain]
        lengths = [
            len(template_ids(self.tokenizer, p, add_generation_prompt=True))
            for p in prompts[: 1 + steered]
        ]
        if max(lengths) >= 1.5 * s.max_token_length:
            self.counts["skipped_long_prompts"] += 1
            self.drop("prompt_too_long")
            return None, []
        max_tokens = max(1, s.max_token_length // 3)
        if steered:
            pairs = await asyncio.gather(
                *(self.generate(p, 1, max_tokens=max_tokens) for p in prompts)
            )
            rollouts = [r for pair in pairs for r in pair]
        else:
            rollouts = await self.generate(plain, 2, max_tokens=max_tokens)
        scores = await self.score_pair(plain, rollouts[0], rollouts[1])
        if scores is None:
            return None, []
        if steered:
            self.counts["steered_pairs"] += 1
            self.counts["steered_preferred"] += scores[0] > scores[1]
        return rollout_group(rollouts, prompts, scores), []  # each with its own prompt

    async def score_pair(
        self, conversation: list[Message], a: Rollout, b: Rollout
    ) -> list[float] | None:
        """The pair's scores: by truncation, else by the judge; None drops it (counted)."""
        reasons = [a.finish_reason, b.finish_reason]
        if all(reason == "length" for reason in reasons):
            self.counts["dropped_both_truncated"] += 1
            self.drop("truncated")
            return None
        decided = truncation_scores(reasons)
        if decided is not None:
            self.counts["truncation_decided"] += 1
            return decided
        preference = self.config.preference
        verdict = await compare(  # --judge.votes answers in each order
            self.judge, lambda x, y: judge_messages(conversation, x, y, preference), a.text, b.text
        )
        self.counts["judged_pairs"] += 1
        self.counts["votes_parsed"] += verdict.parsed
        self.counts["votes_unparsed"] += verdict.unparsed
        if verdict.scores is None:
            self.counts["dropped_unparsed"] += 1
            self.drop("no_judge_vote")
            return None
        return list(verdict.scores)


_WORD = re.compile(r"[a-z]{5,}")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: judge requests get a verdict for the
    reply sharing more words with the preference (ties: the longer reply); others get random
    text (None). `python -m atropos.testing.fake_server --port 9001 --responder
    atropos.environments.rlaif:demo_responder`."""
    if "[Response A]" not in prompt_text or "[Preference]" not in prompt_text:
        return None
    body = prompt_text.rsplit("[Response A]", 1)[1]
    first, rest = body.split("[Response B]", 1)
    second, preference = rest.split("[Preference]", 1)
    wanted = set(_WORD.findall(preference.lower()))

    def fit(reply: str) -> tuple[int, int]:
        return len(wanted & set(_WORD.findall(reply.lower()))), len(reply)

    choice = "A" if fit(first) >= fit(second) else "B"
    return f"Weighing the tone of each reply against the preference. \\boxed{{{choice}}}"
