"""`reasoning_gym`: any task of the reasoning-gym package, or a weighted mix of them.

Items are generated offline with a seed (`reasoning_gym.create_dataset(name, seed=, size=,
**config)`); a completion's answer (`answers.extract_answer`: the last `<answer>` block, else
the text after the last `</think>`) is scored by the task's own `score_answer`, 0.0 to 1.0.
`--env.tasks "leg_counting,basic_arithmetic:2"` mixes tasks by weight; a `--config` file can
list `{name, weight, config}` entries with each task's own settings (`tasks.py`). With
`--env.curriculum true`, a task that has a reasoning-gym curriculum starts at its lowest level
and rises a level when its rolling accuracy passes `--env.curriculum_threshold` (`state.py`).
Metrics: `train/accuracy/<task>` (the share of rollouts scored 1.0), `curriculum/level/<task>`,
and per-task accuracy in `evaluate` (`eval/accuracy/<task>`). Details: docs/ecosystem.md.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any, ClassVar

from pydantic import Field, field_validator

from atropos.environments.reasoning_gym.answers import extract_answer
from atropos.environments.reasoning_gym.state import TaskState, check_settings
from atropos.environments.reasoning_gym.tasks import TaskSpec, check_known, parse_tasks, pick
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message

__all__ = ["ReasoningGym", "ReasoningGymConfig", "TaskSpec", "extract_answer"]

log = logging.getLogger(__name__)
DEFAULT_TASKS = "leg_counting,basic_arithmetic,chain_sum,spell_backward,word_sorting"
UNSCORABLE_KEPT = 4096  # completions whose scoring failed, awaiting their outcome
EVAL_SEED_OFFSET = 1_000_003  # eval items come from seed + this: apart from any training index


class ReasoningGymConfig(BaseEnvConfig):
    """`reasoning_gym`'s settings."""

    tasks: list[TaskSpec] = Field(
        default_factory=lambda: parse_tasks(DEFAULT_TASKS),
        description="tasks as 'name[:weight],...', or in a --config file a list of"
        " {name, weight, config}",
    )
    seed: int = Field(default=0, description="seed of the generated items and of the task draw")
    dataset_size: int = Field(
        default=10_000, ge=1, description="items per task and level before they repeat"
    )
    eval_size: int = Field(default=20, ge=0, description="eval items per task")
    curriculum: bool = Field(
        default=False, description="raise a task's difficulty as it is mastered (where it can)"
    )
    curriculum_threshold: float = Field(
        default=0.8, ge=0, le=1, description="rolling accuracy above which a task's level rises"
    )
    curriculum_window: int = Field(
        default=64, ge=1, description="rollouts in a task's rolling accuracy"
    )
    system_prompt: str | None = Field(
        default=None, description="system prompt (unset: reasoning-gym's 'default' prompt)"
    )

    @field_validator("tasks", mode="before")
    @classmethod
    def _parse_tasks(cls, value: Any) -> list[TaskSpec]:
        specs = parse_tasks(value)
        try:  # a misspelt name is a usage error of the command line: one line, exit 2
            from reasoning_gym.factory import DATASETS
        except ImportError:  # named by the runner's missing-package check instead
            return specs
        check_known(specs, DATASETS)
        for spec in specs:
            check_settings(spec.name, spec.config)
        return specs


class ReasoningGym(Env[ReasoningGymConfig]):
    """Procedurally generated reasoning tasks from reasoning-gym, scored by their own scorers."""

    name = "reasoning_gym"
    requires: ClassVar[dict[str, str]] = {"reasoning_gym": "reasoning-gym"}
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}

    @property
    def states(self) -> dict[str, TaskState]:
        """Each task's state by name (made, and the names checked, on first use)."""
        if "_states" not in self.__dict__:
            from reasoning_gym.factory import DATASETS

            s = self.config
            check_known(s.tasks, DATASETS)
            self.__dict__["_states"] = {
                t.name: TaskState.start(t, s.seed, s.dataset_size, s.curriculum) for t in s.tasks
            }
        states: dict[str, TaskState] = self.__dict__["_states"]
        return states

    @functools.cached_property
    def _unscorable(self) -> set[str]:
        """Completions the task's scorer failed on, until `invalid_reason` reads them."""
        return set()

    def load(self) -> list[dict[str, Any]]:
        """One item per task (items are generated as they are asked for)."""
        return [state.next_item() for state in self.states.values()]

    def load_eval(self) -> list[dict[str, Any]]:
        """`eval_size` items per task at its current level, from seed + 1,000,003."""
        seed, count = self.config.seed + EVAL_SEED_OFFSET, self.config.eval_size
        return [item for state in self.states.values() for item in state.items_apart(seed, count)]

    async def setup(self) -> None:
        self._rng = random.Random(self.config.seed)
        _ = self.states

    async def get_next_item(self) -> dict[str, Any]:
        return self.states[pick(self.config.tasks, self._rng).name].next_item()

    def prompt(self, item: Any) -> list[Message]:
        system = self.config.system_prompt
        if system is None:
            from reasoning_gym.utils import SYSTEM_PROMPTS

            system = SYSTEM_PROMPTS["default"]
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": item["question"]},
        ]

    def score(self, item: Any, completion: str) -> float:
        """The task's own verdict on the extracted answer (0.0 where its scorer fails on it:
        the answer is malformed for the task, the policy's fault, counted
        `invalid/unscorable_answer` by `invalid_reason`)."""
        try:
            return self.states[item["task"]].score(extract_answer(completion), item)
        except Exception as e:  # a scorer choking on a malformed answer: a wrong answer
            log.debug("%s: scorer failed on an answer: %r", item["task"], e)
            if len(self._unscorable) >= UNSCORABLE_KEPT:  # evaluations never ask: bounded
                self._unscorable.clear()
            self._unscorable.add(completion)
            return 0.0

    def invalid_reason(self, item: Any, rollout: Rollout) -> str | None:
        """`no_answer`: no `<answer>` to extract; `unscorable_answer`: the task's scorer failed
        on the answer (both scored 0.0)."""
        if extract_answer(rollout.text) is None:
            return "no_answer"
        if rollout.text in self._unscorable:
            self._unscorable.discard(rollout.text)
            return "unscorable_answer"
        return None

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        task = item["task"]
        right = [float(s >= 1.0) for s in scores]
        self.record_mean(f"train/accuracy/{task}", right)
        self.record_mean("train/accuracy", right)
        self.record_mean(f"train/score/{task}", scores)
        self.record_mean(
            "errors/no_answer_rate", (float(extract_answer(r.text) is None) for r in rollouts)
        )
        s = self.config
        if self.states[task].record(
            item["level"], right, s.curriculum_window, s.curriculum_threshold
        ):
            log.info("reasoning_gym: %s rises to level %d", task, self.states[task].level)
        return self.unless_all_equal(scores)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        for task, state in self.states.items():
            if state.curriculum is not None:
                metrics[f"curriculum/level/{task}"] = state.level
        await super().wandb_log(metrics)

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "levels": {task: state.level for task, state in self.states.items()},
            "next_index": {task: state.next_index for task, state in self.states.items()},
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        for task, level in state.get("levels", {}).items():
            if task in self.states and self.states[task].curriculum is not None:
                self.states[task].set_level(int(level))
        for task, index in state.get("next_index", {}).items():
            if task in self.states:
                self.states[task].next_index = int(index)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        return {"task": item["task"], "level": item["level"], "question": item["question"],
                "answer": item["answer"], "extracted": extract_answer(r.text),
                "completion": r.text, "finish_reason": r.finish_reason, "score": score}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Mean score, accuracy (the share scored 1.0), and accuracy per task."""
        found = {
            "eval/mean_score": sum(s["score"] for s in samples) / len(samples),
            "eval/accuracy": sum(s["score"] >= 1.0 for s in samples) / len(samples),
        }
        for task in sorted({s["task"] for s in samples}):
            at = [s["score"] >= 1.0 for s in samples if s["task"] == task]
            found[f"eval/accuracy/{task}"] = sum(at) / len(at)
        return found
