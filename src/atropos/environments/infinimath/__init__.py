"""`infinimath`: procedurally generated arithmetic with a curriculum over eight levels.

Items are generated offline and seeded (`problems.py`): item N comes from
`Random(f"{seed}:{N}")` at the current level, from two one-digit numbers added (level 1) to six
terms with parentheses three deep, negative numbers, fractions and powers (level 8). The answer
is the last `\\boxed{}` after the think block, checked numerically (`problems.same_value`: a
whole number, `a/b`, `\\frac{a}{b}`, or a decimal within `tolerance`): 1.0 right, else 0.0.

The curriculum (`common.curriculum.Curriculum`, `--env.curriculum`, on by default) counts each
rollout at the current level in a window of `curriculum_window`; above `curriculum_threshold`
the level rises, below `curriculum_lower_threshold` (0: never) it falls. The level, the window
and the item counter are kept in checkpoints. Metrics: `train/accuracy` and per level
(`train/accuracy/L<n>`), `curriculum/level`, `curriculum/window_accuracy`,
`errors/no_boxed_rate`; `evaluate` runs `eval_per_level` seeded items of every level and reports
`eval/accuracy/L<n>`. Details: docs/formats.md.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any, ClassVar, cast

from pydantic import Field, model_validator

from atropos.environments.common.completions import (
    THINKING_DEFAULTS,
    answer_part,
    boxed_contents,
    conversation,
)
from atropos.environments.common.curriculum import Curriculum
from atropos.environments.common.demo import Alternating, with_thinking
from atropos.environments.infinimath.problems import (
    LEVELS,
    answer_text,
    generate,
    same_value,
    value_of,
)
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message

__all__ = ["LEVELS", "InfiniMath", "InfiniMathConfig", "demo_responder", "stated_answer"]

log = logging.getLogger(__name__)
QUESTION = "Compute the value of this expression ('^' is a power):"
INSTRUCTION = (
    "Give the exact value, as a whole number or a fraction a/b in lowest terms, inside \\boxed{}."
)


def stated_answer(completion: str, thinking: bool) -> str | None:
    """The completion's answer: its last `\\boxed{}` (after the think block when `thinking`)."""
    body = answer_part(completion, thinking)
    found = boxed_contents(body) if body is not None else []
    return found[-1] if found else None


class InfiniMathConfig(BaseEnvConfig):
    """`infinimath`'s settings."""

    starting_level: int = Field(default=1, ge=1, le=len(LEVELS), description="first level")
    min_level: int = Field(default=1, ge=1, le=len(LEVELS), description="lowest level")
    max_level: int = Field(default=len(LEVELS), ge=1, le=len(LEVELS), description="highest level")
    curriculum: bool = Field(default=True, description="move the level with the accuracy")
    curriculum_window: int = Field(default=64, ge=1, description="rollouts in the window")
    curriculum_threshold: float = Field(
        default=0.8, ge=0, le=1, description="window accuracy above which the level rises"
    )
    curriculum_lower_threshold: float = Field(
        default=0.0, ge=0, le=1, description="window accuracy below which it falls (0: never)"
    )
    tolerance: float = Field(default=1e-6, ge=0, description="relative tolerance of a decimal")
    eval_per_level: int = Field(default=10, ge=0, description="eval items of each level")
    seed: int = Field(default=0, description="seed of the generated items")

    @model_validator(mode="after")
    def _levels_in_order(self) -> InfiniMathConfig:
        if not self.min_level <= self.starting_level <= self.max_level:
            raise ValueError("levels must satisfy min_level <= starting_level <= max_level")
        return self


class InfiniMath(Env[InfiniMathConfig]):
    """Generated arithmetic; the level follows the policy's accuracy."""

    name = "infinimath"
    config_defaults: ClassVar[dict[str, Any]] = {**THINKING_DEFAULTS}

    @property
    def curriculum(self) -> Curriculum:
        """The curriculum state (made at the starting level on first use)."""
        if "_curriculum" not in self.__dict__:
            s = self.config
            self.__dict__["_curriculum"] = Curriculum(
                s.starting_level,
                s.curriculum_window,
                s.curriculum_threshold,
                s.curriculum_lower_threshold,
                s.min_level,
                s.max_level,
            )
        return cast(Curriculum, self.__dict__["_curriculum"])

    def make_item(self, level: int, seed: str) -> dict[str, Any]:
        """A problem of `level` drawn with `Random(seed)`."""
        problem = generate(LEVELS[level], random.Random(seed))
        return {"level": level, "expression": problem.text, "answer": problem.answer}

    def load(self) -> list[dict[str, Any]]:
        """One item of each level in use (items are generated as they are asked for)."""
        s = self.config
        return [self.make_item(n, f"{s.seed}:L{n}") for n in range(s.min_level, s.max_level + 1)]

    def load_eval(self) -> list[dict[str, Any]]:
        """`eval_per_level` items of each level, from seeds of their own."""
        s = self.config
        return [
            self.make_item(level, f"eval:{s.seed}:{level}:{i}")
            for level in range(s.min_level, s.max_level + 1)
            for i in range(s.eval_per_level)
        ]

    async def setup(self) -> None:
        self.drawn = getattr(self, "drawn", 0)

    async def get_next_item(self) -> dict[str, Any]:
        self.drawn += 1
        return self.make_item(self.curriculum.level, f"{self.config.seed}:{self.drawn}")

    def prompt(self, item: Any) -> list[Message]:
        return conversation(self.config, f"{QUESTION}\n\n{item['expression']}\n\n{INSTRUCTION}")

    def score(self, item: Any, completion: str) -> float:
        stated = stated_answer(completion, self.config.thinking_mode)
        right = stated is not None and same_value(stated, item["answer"], self.config.tolerance)
        return 1.0 if right else 0.0

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        level, thinking = item["level"], self.config.thinking_mode
        for key in ("train/accuracy", f"train/accuracy/L{level}"):
            self.record_mean(key, scores)
        missing = (float(stated_answer(r.text, thinking) is None) for r in rollouts)
        self.record_mean("errors/no_boxed_rate", missing)
        if self.config.curriculum:
            moves = [self.curriculum.record(score, level) for score in scores]
            if any(moves):
                log.info("infinimath: level %d now (was %d)", self.curriculum.level, level)
        return self.unless_all_equal(scores)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        metrics["curriculum/level"] = self.curriculum.level
        if self.curriculum.success_rate is not None:
            metrics["curriculum/window_accuracy"] = self.curriculum.success_rate
        await super().wandb_log(metrics)

    def checkpoint_state(self) -> dict[str, Any]:
        c = self.curriculum
        return {"level": c.level, "scores": list(c.scores), "drawn": getattr(self, "drawn", 0)}

    def restore_state(self, state: dict[str, Any]) -> None:
        c, s = self.curriculum, self.config
        c.level = min(s.max_level, max(s.min_level, int(state.get("level", c.level))))
        c.scores = [float(v) for v in state.get("scores", [])][-c.window :]
        self.drawn = int(state.get("drawn", 0))

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        stated = stated_answer(r.text, self.config.thinking_mode)
        return {**item, "stated": stated, "completion": r.text, "finish_reason": r.finish_reason,
                "score": score}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Accuracy overall and per level."""
        found = {"eval/accuracy": sum(s["score"] for s in samples) / len(samples)}
        for level in sorted({s["level"] for s in samples}):
            at = [s["score"] for s in samples if s["level"] == level]
            found[f"eval/accuracy/L{level}"] = sum(at) / len(at)
        return found


_turns = Alternating()
_EXPRESSION = re.compile(re.escape(QUESTION) + r"\s*\n\n(.+?)\n")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: the right value on every other call,
    one more on the others; None (random text) for other prompts. `python -m
    atropos.testing.fake_server --port 9001 --responder
    atropos.environments.infinimath:demo_responder`."""
    found = _EXPRESSION.search(prompt_text)
    if found is None:
        return None
    answer = answer_text(value_of(found.group(1)) + (0 if _turns.right() else 1))
    thinking = "I work from the innermost parentheses outwards."
    return with_thinking(prompt_text, thinking, f"The value is \\boxed{{{answer}}}.")
