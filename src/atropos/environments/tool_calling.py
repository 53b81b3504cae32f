"""`tool_calling`: answer a request with the right function call(s), single or parallel.

Items come from ShareGPT `conversations` rows, as in upstream's `NousResearch/XLAM-Atropos`: a
system turn holding the tool schemas, a human turn (the request) and a gpt turn whose
`<tool_call>` blocks are the expected calls. The shipped fixture (`data/tool_calling/`) is
used unless `--env.dataset_name` names a hub dataset. Scoring: `tool_calls.score_calls`, then
upstream's group rules; details in `docs/tool_calling.md`.

>>> call = '<tool_call>{"name": "w", "arguments": {"city": "Oslo"}}</tool_call>'
>>> row = {"conversations": [{"from": "system", "value": "<tools>...</tools>"},
...     {"from": "human", "value": "Weather in Oslo?"}, {"from": "gpt", "value": call}]}
>>> item = to_item(row, "example")
>>> item["request"], item["expected"]
('Weather in Oslo?', [{'name': 'w', 'arguments': {'city': 'Oslo'}}])
>>> answer = '<tool_call>{"name": "w", "arguments": {"city": "Oslo", "unit": "C"}}</tool_call>'
>>> score_item(item, answer), score_item(item, "It is sunny in Oslo.")
(1.0, -1.0)
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.data_loading import (
    data_path,
    in_prompt,
    load_hub,
    read_jsonl,
    split_rows,
)
from atropos.environments.common.tool_calls import (
    parse_completion,
    parse_message,
    parse_text,
    score_calls,
)
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message
from atropos.rewards.group import length_penalty, too_short

__all__ = [
    "SYSTEM_PREAMBLE",
    "ToolCalling",
    "ToolCallingConfig",
    "demo_responder",
    "load_rows",
    "score_item",
    "score_message",
    "split_rows",
    "to_item",
]

SYSTEM_PREAMBLE = (
    "You are a careful assistant who thinks before acting. You may reason privately inside"
    " <think> </think> tags first; after </think>, give your answer."
)
_ROLES = {"system": "system", "human": "human", "user": "human", "gpt": "gpt", "assistant": "gpt"}


def to_item(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An item (`system`, `request`, `expected`) from a `conversations` row (`from`/`value`, or
    `role`/`content`); `where` names the row in errors."""
    turns = row.get("conversations")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: expected a 'conversations' list, got {type(turns).__name__}")
    by_role: dict[str, str] = {}
    for turn in turns:
        if not isinstance(turn, Mapping):
            raise ValueError(f"{where}: a turn must be an object, got {type(turn).__name__}")
        role = _ROLES.get(str(turn.get("from", turn.get("role"))))
        value = turn.get("value", turn.get("content"))
        if role and role not in by_role and isinstance(value, str):
            if role != "gpt" or "human" in by_role:  # the answer follows the request
                by_role[role] = value
    for role in ("human", "gpt"):
        if role not in by_role:
            raise ValueError(f"{where}: no {role!r} turn in 'conversations'")
    expected = parse_text(by_role["gpt"])
    if expected.malformed:
        raise ValueError(f"{where}: the gpt turn has {expected.malformed} unreadable <tool_call>")
    return {
        "system": by_role.get("system", ""),
        "request": by_role["human"],
        "expected": expected.calls,
    }


def load_rows(
    split: str, dataset_name: str | None = None, test_size: int = 100
) -> list[dict[str, Any]]:
    """The items of `split` ("train" or "test"): the shipped fixture, or the hub dataset's train
    split divided by `split_rows` (the same rows on every run)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not dataset_name:
        path = data_path("tool_calling", f"{split}.jsonl")
        return [to_item(r, f"{path} row {n}") for n, r in enumerate(read_jsonl(path), 1)]
    rows = load_hub(dataset_name, "train", "default")
    try:
        train, test = split_rows(rows, test_size)
    except ValueError as e:
        raise ValueError(f"{dataset_name} has {len(rows)} rows: {e}") from None
    chosen = test if split == "test" else train
    return [to_item(r, f"{dataset_name} {split} row {n}") for n, r in enumerate(chosen)]


def score_item(
    item: Mapping[str, Any], completion: str, partial: bool = False, lenient: bool = False
) -> float:
    """The reward of a completion's calls (Hermes blocks, or a JSON message with `tool_calls`)."""
    return score_calls(item["expected"], parse_completion(completion), partial, lenient)


def score_message(
    item: Mapping[str, Any],
    message: Mapping[str, Any],
    partial: bool = False,
    lenient: bool = False,
) -> float:
    """The reward of an assistant message dict (its OpenAI `tool_calls` and its content)."""
    return score_calls(item["expected"], parse_message(message), partial, lenient)


class ToolCallingConfig(BaseEnvConfig):
    """`tool_calling`'s settings."""

    dataset_name: str | None = Field(
        default=None, description="hub dataset, e.g. NousResearch/XLAM-Atropos (unset: fixture)"
    )
    test_size: int = Field(default=100, ge=1, description="hub rows held out for evaluation")
    partial_credit: bool = Field(
        default=False, description="score 2k/(E+X)-1 for k of E calls matched and X extra"
    )
    lenient_types: bool = Field(
        default=False, description='let a string match the number it spells ("3" and 3)'
    )
    eval_temperature: float = Field(default=1.0, ge=0, description="sampling temperature of eval")


class ToolCalling(Env[ToolCallingConfig]):
    """Call the right function(s) with the right arguments; +1/-1 (or partial credit)."""

    name = "tool_calling"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 2048, "use_wandb": False
    }  # fmt: skip
    temperature = 0.8

    def load(self) -> list[dict[str, Any]]:
        return load_rows("train", self.config.dataset_name, self.config.test_size)

    def load_eval(self) -> list[dict[str, Any]]:
        items = load_rows("test", self.config.dataset_name, self.config.test_size)
        return [i for i in items if i["expected"]]  # nothing to call: nothing to measure

    def prompt(self, item: Any) -> list[Message]:
        system = SYSTEM_PREAMBLE + ("\n\n" + item["system"] if item["system"] else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": item["request"]}]

    def score(self, item: Any, completion: str) -> float:
        s = self.config
        return score_item(item, completion, s.partial_credit, s.lenient_types)

    def invalid_reason(self, item: Any, rollout: Rollout) -> str | None:
        """`malformed_call`: a `<tool_call>` block that cannot be read (scored as usual)."""
        return "malformed_call" if parse_completion(rollout.text).malformed else None

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        if not item["expected"]:
            self.drop("bad_gold")  # no calls expected: nothing to check against
            return None
        lengths = [r.trained_tokens for r in rollouts]
        if too_short(lengths):
            self.drop("too_short")
            return None
        self.record_mean("train/percent_correct", (1.0 if s >= 1.0 else 0.0 for s in scores))
        return self.unless_all_equal(length_penalty(scores, lengths, self.config.max_token_length))

    def eval_sample(self, item: Any, rollout: Rollout, score: float) -> dict[str, Any]:
        return {**super().eval_sample(item, rollout, score), "expected": item["expected"]}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One sample per held-out item: `eval/percent_correct` is the share exactly right."""
        return {
            "eval/percent_correct": sum(s["score"] >= 1.0 for s in samples) / len(samples),
            "eval/mean_score": sum(s["score"] for s in samples) / len(samples),
        }


_demo_turns = itertools.count()


@functools.cache
def _fixture_answers() -> dict[str, list[dict[str, Any]]]:
    return {i["request"]: i["expected"] for s in ("train", "test") for i in load_rows(s)}


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a prompt holding a fixture
    request, its expected calls on every other call and the first call without arguments on the
    others (so groups are mixed); None (random text) for any other prompt."""
    expected = in_prompt(_fixture_answers(), prompt_text)
    if expected is None:
        return None
    calls = expected if next(_demo_turns) % 2 == 0 else [{**expected[0], "arguments": {}}]
    return "\n".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
