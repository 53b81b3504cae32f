"""A single-turn verifiers taskset written for our tests: add two numbers.

Runs in the verifiers venv only (scripts/upstream_venv.py verifiers). Two weighted reward
functions, so the episode's reward is verifiers' weighted sum, not one function's score.
"""

import re

import verifiers.v1 as vf

PAIRS = [(2, 3), (4, 4), (10, 7), (1, 8), (6, 9), (12, 30)]


def grade(answer: str, reply: str) -> tuple[float, float]:
    """(correct, formatted): the reply's last number is the answer; it says 'The answer is'."""
    numbers = re.findall(r"-?\d+", reply)
    correct = 1.0 if numbers and numbers[-1] == answer else 0.0
    return correct, 1.0 if "The answer is" in reply else 0.0


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return grade(task.answer, trace.last_reply)[0]

    @vf.reward(weight=0.25)
    async def formatted(self, task: SumData, trace: vf.Trace) -> float:
        return grade(task.answer, trace.last_reply)[1]

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumsConfig(vf.TasksetConfig):
    offset: int = 0


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self):
        for a, b in PAIRS:
            a += self.config.offset
            prompt = f"What is {a} + {b}? Reply 'The answer is N.'"
            yield SumTask(SumData(prompt=prompt, answer=str(a + b), name=f"{a}+{b}"))


__all__ = ["SumsTaskset"]
