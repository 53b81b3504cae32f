"""`instruction_following`: follow a verifiable instruction (RLVR-IFeval), checked by our verifiers.

Each item is a prompt plus a `ground_truth` JSON naming a check of `common.ifeval`
(`func_name`) and its arguments; items naming an unknown check, or arguments it cannot use, are
dropped and reported (with "did you mean"). A completion needs exactly one well-ordered
`<think>...</think>` and nothing think-like after it; the stripped text after `</think>` goes
to the check with only the non-null arguments it accepts: 1.0 followed, else 0.0. Groups
averaging above `max_group_average_for_training` (0.75) are skipped; all-correct groups pay a
length penalty above 75% of `max_token_length`; all-equal groups are dropped. The active-queue
curriculum (`ActiveQueue`) retires solved items and refills from them when it runs dry.
Details: docs/text_tasks.md.

>>> score_response("<think>plan</think> all lowercase here.", "validate_lowercase", {})
1.0
>>> score_response("all lowercase here.", "validate_lowercase", {})  # thinking is required
0.0
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from pydantic import Field

from atropos.environments.common import ifeval
from atropos.environments.common.data_loading import data_path, in_prompt, load_hub, read_jsonl
from atropos.environments.instruction_following.active_queue import ActiveQueue, item_id
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Item, ScoredDataGroup
from atropos.rewards.group import length_penalty, too_short
from atropos.rewards.text import split_think

__all__ = [
    "SYSTEM_PROMPT",
    "InstructionFollowing",
    "InstructionFollowingConfig",
    "demo_responder",
    "load_items",
    "score_response",
    "split_items",
    "to_item",
]

log = logging.getLogger("atropos.env")
SYSTEM_PROMPT = (
    "You are a careful thinker. Reason for as long as you need inside <think> </think> tags,"
    " then write your response after the closing </think> tag, following every instruction."
)
LENGTH_PENALTY_THRESHOLD = 0.75  # upstream's IF env: 75% of max_token_length, not 50%


def to_item(row: Mapping[str, Any]) -> dict[str, Any]:
    """An item (`id`, `prompt`, `func_name`, `args`) from an RLVR-IFeval row (`messages` or
    `prompt`, and `ground_truth` as JSON text or an object).

    Raises:
        ValueError: the row is malformed, or its arguments do not suit its check.
        ifeval.UnknownCheck: its check does not exist.
    """
    messages = row.get("messages")
    prompt = messages[0].get("content") if isinstance(messages, list) and messages else None
    prompt = prompt or row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("no prompt (expected messages[0].content or prompt)")
    truth = row.get("ground_truth")
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except ValueError:
            raise ValueError("ground_truth is not JSON") from None
    if not isinstance(truth, Mapping) or not truth.get("func_name"):
        raise ValueError("ground_truth has no func_name")
    args = {k: v for k, v in truth.items() if k != "func_name" and v is not None}
    ifeval.validate(str(truth["func_name"]), args)
    item = {"prompt": prompt, "func_name": str(truth["func_name"]), "args": args}
    return {"id": item_id(item), **item}


def load_items(rows: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The usable items of `rows`; the others are counted by reason in one warning."""
    items, dropped = [], Counter[str]()
    for row in rows:
        try:
            items.append(to_item(row))
        except (ValueError, LookupError) as e:
            dropped[str(e).strip("'\"")] += 1
    if dropped:
        reasons = "; ".join(f"{reason} (x{n})" for reason, n in dropped.most_common())
        log.warning("%s: dropped %d of %d rows: %s", where, dropped.total(), len(rows), reasons)
    return items


def split_items(
    items: list[dict[str, Any]], ratio: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test): the items shuffled with `seed`, `ratio` of them (at least 1) held out."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    held = min(max(1, int(len(shuffled) * ratio)), len(shuffled) - 1)
    return shuffled[held:], shuffled[:held]


def score_response(completion: str, func_name: str, args: Mapping[str, Any]) -> float:
    """1.0 when the text after the completion's one think block follows the instruction."""
    after = split_think(completion)
    return 1.0 if after is not None and ifeval.verify(func_name, after.strip(), args) else 0.0


class InstructionFollowingConfig(BaseEnvConfig):
    """`instruction_following`'s settings."""

    dataset_name: str | None = Field(
        default=None, description="hub dataset, e.g. allenai/RLVR-IFeval (unset: the fixture)"
    )
    dataset_config_name: str | None = Field(default=None, description="the hub dataset's config")
    test_set_ratio: float = Field(default=0.05, gt=0, lt=1, description="hub rows held out")
    dataset_shuffle_seed: int = Field(default=42, description="seed of the hub split")
    max_group_average_for_training: float = Field(
        default=0.75, description="skip groups (and retire items) averaging above this"
    )
    solve_on_single_correct: bool = Field(
        default=False, description="retire an item as soon as one completion follows it"
    )
    eval_temperature: float = Field(default=0.2, ge=0, description="sampling temperature of eval")


class InstructionFollowing(Env[InstructionFollowingConfig]):
    """Follow a verifiable instruction; 1.0/0.0 from the `ifeval` checks."""

    name = "instruction_following"
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    system_prompt = SYSTEM_PROMPT
    temperature = 0.8

    @functools.cached_property
    def _splits(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        s = self.config
        if not s.dataset_name:
            train, test = (
                data_path("instruction_following", f"{x}.jsonl") for x in ("train", "test")
            )
            return load_items(read_jsonl(train), str(train)), load_items(
                read_jsonl(test), str(test)
            )
        rows = load_hub(s.dataset_name, "train", s.dataset_config_name)
        return split_items(
            load_items(rows, s.dataset_name), s.test_set_ratio, s.dataset_shuffle_seed
        )

    def load(self) -> list[dict[str, Any]]:
        return self._splits[0]

    def load_eval(self) -> list[dict[str, Any]]:
        return self._splits[1]

    @property
    def queue(self) -> ActiveQueue:
        """The active-queue curriculum (filled with the training items on first use)."""
        if "_queue" not in self.__dict__:
            self.__dict__["_queue"] = ActiveQueue(self.load())
        return cast(ActiveQueue, self.__dict__["_queue"])

    async def setup(self) -> None:
        if not self.queue.total:
            raise ValueError("instruction_following: no usable items")
        self.iter = getattr(self, "iter", 0)

    async def get_next_item(self) -> Item:
        self.iter += 1
        return self.queue.next()

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        try:
            return await super().collect_trajectories(item)
        except BaseException:
            self.queue.put_back(item)  # a failed rollout does not lose its item
            raise

    def score(self, item: Any, completion: str) -> float:
        return score_response(completion, item["func_name"], item["args"])

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        s = self.config
        self.queue.record(item, scores, s.max_group_average_for_training, s.solve_on_single_correct)
        if too_short([r.trained_tokens for r in rollouts]):
            self.drop("too_short")
            return None
        self.record_mean("train/percent_correct", scores)
        if sum(scores) / len(scores) > s.max_group_average_for_training:
            self.drop("too_easy")
            return None
        lengths = [len(r.tokens) for r in rollouts]  # upstream: the whole sequence
        scores = length_penalty(
            scores, lengths, s.max_token_length, threshold=LENGTH_PENALTY_THRESHOLD
        )
        return self.unless_all_equal(scores)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        await super().wandb_log({**(metrics or {}), **self.queue.metrics()})

    def checkpoint_state(self) -> dict[str, Any]:
        return {"iter": getattr(self, "iter", 0), **self.queue.state()}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.iter = int(state.get("iter", 0))
        self.queue.restore(state)

    def eval_sample(self, item: Item, rollout: Rollout, score: float) -> dict[str, Any]:
        return {**item, "completion": rollout.text, "score": score}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One sample per held-out item at `eval_temperature` -> `eval/percent_correct`."""
        return {"eval/percent_correct": sum(x["score"] for x in samples) / len(samples)}


_demo_turns = itertools.count()


@functools.cache
def _examples() -> dict[str, str]:
    return {
        row["messages"][0]["content"]: row["example_response"]
        for split in ("train", "test")
        for row in read_jsonl(data_path("instruction_following", f"{split}.jsonl"))
    }


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: a fixture prompt's example response
    after a think block on every other call, and without one (so scored 0) on the others;
    None (random text) for other prompts. `python -m atropos.testing.fake_server --port 9001
    --responder atropos.environments.instruction_following:demo_responder`."""
    example = in_prompt(_examples(), prompt_text)
    if example is None:
        return None
    if next(_demo_turns) % 2:
        return example
    return f"<think>Let me check each part of the instruction before I answer.</think>\n{example}"
