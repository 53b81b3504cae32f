"""The judge's verdict on an answer (`--env.answer_metric judge`): right or not, against the
gold answers.

The judge (`atropos.envs.judge`, `--judge.*`; the policy's own servers without a `base_url`)
sees the question, the accepted answers and the proposed one, and ends with `\\boxed{yes}` or
`\\boxed{no}`; it is asked `--judge.votes` times. The verdict is the share of parsed votes that
say yes; with no parsed vote there is none (the group is dropped as `no_judge_vote`, never
scored 0).

>>> votes(["Same person. \\\\boxed{yes}", "\\\\boxed{No}", "unsure"])
(0.5, 1)
>>> votes(["I cannot tell."])
(None, 1)
"""

from __future__ import annotations

from collections.abc import Sequence

from atropos.environments.deep_research.questions import Question
from atropos.envs.judge import Judge, boxed_choice
from atropos.envs.types import Message

__all__ = ["judge_messages", "verdict", "votes"]

_SYSTEM = (
    "You check answers to questions. An answer is right when it means the same as one of the"
    " accepted answers (other wording, extra detail that does not contradict them, or a"
    " different but equivalent form of a name, number or date is fine). Reason briefly, then"
    " end with \\boxed{yes} if the answer is right or \\boxed{no} if it is not."
)


def judge_messages(question: Question, answer: str) -> list[Message]:
    """The judge's request for one answer."""
    accepted = "\n".join(f"- {a}" for a in question.answers)
    text = (
        f"Question: {question.question}\n\nAccepted answers:\n{accepted}\n\n"
        f"Proposed answer: {answer}\n\nIs the proposed answer right?"
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": text}]


def votes(answers: Sequence[str]) -> tuple[float | None, int]:
    """(share of parsed votes saying yes, or None with none parsed; unparsed answers)."""
    parsed = [boxed_choice(a, ("yes", "no")) for a in answers]
    said = [p for p in parsed if p is not None]
    share = sum(1 for p in said if p == "yes") / len(said) if said else None
    return share, len(parsed) - len(said)


async def verdict(judge: Judge, question: Question, answer: str) -> tuple[float | None, int]:
    """The judge's verdict on `answer` (`votes` of `--judge.votes` answers)."""
    return votes(await judge.complete(judge_messages(question, answer), judge.config.votes))
