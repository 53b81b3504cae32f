"""A single-turn OpenEnv environment written with openenv-core's own classes, for the tests.

`reset(seed)` asks for the sum of two numbers the seed picks; one `step(AnswerAction(answer))`
ends the episode with reward 1.0 when the answer holds the sum, else 0.0. An answer of "boom"
makes `step` raise (the server reports an EXECUTION_ERROR): the tests' remote failure.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State


class AnswerAction(Action):
    answer: str


class QuestionObservation(Observation):
    question: str = ""
    feedback: str = ""


class ArithEnv(Environment[AnswerAction, QuestionObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.total = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        rng = random.Random(seed)
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        self.total = a + b
        self._state = State(episode_id=episode_id, step_count=0)
        return QuestionObservation(question=f"What is {a} + {b}? Answer with the number.")

    def step(self, action: AnswerAction, timeout_s: float | None = None, **kw: Any) -> Any:
        if action.answer.strip() == "boom":
            raise RuntimeError("the environment broke")
        self._state.step_count += 1
        right = str(self.total) in action.answer
        return QuestionObservation(
            feedback="right" if right else "wrong", reward=1.0 if right else 0.0, done=True
        )

    @property
    def state(self) -> State:
        return self._state
