"""The math environment's prompts: solving, verifying a solution, retrying with a
verification, and preferring one of two correct solutions (our wording of upstream's four).

>>> [m["role"] for m in judge_messages("1+1?", "It is \\\\boxed{2}.")]
['system', 'user']
>>> "\\\\boxed{True}" in judge_messages("1+1?", "2")[1]["content"]
True
"""

from __future__ import annotations

from atropos.envs.types import Message

__all__ = [
    "JUDGE_TEMPLATE",
    "RETRY_TEMPLATE",
    "RLAIF_TEMPLATE",
    "SYSTEM_PROMPT",
    "judge_messages",
    "retry_messages",
    "rlaif_messages",
]

SYSTEM_PROMPT = (
    "You are a deep thinking AI. You may think for as long as you need, reasoning step by step"
    " and checking your own work, before you answer. Put your thoughts and internal monologue"
    " inside <think> </think> tags, then give your solution, with the final answer written as"
    " \\boxed{answer}."
)


def _block(tag: str, field: str) -> str:
    """`[START TAG]`, the template field `{field}`, `[END TAG]`: a line each."""
    return f"[START {tag}]\n{{{field}}}\n[END {tag}]\n"


_PROBLEM_AND_SOLUTION = _block("PROBLEM", "problem") + _block("SOLUTION", "solution")

JUDGE_TEMPLATE = (
    "Below are a math problem and a proposed solution.\n\n"
    + _PROBLEM_AND_SOLUTION
    + """
Check whether the solution is correct.

If it is correct, include \\boxed{{True}} in your response.
If it is incorrect, include \\boxed{{False}} in your response.

Also explain how to solve the problem correctly."""
)

RETRY_TEMPLATE = (
    "Below are a math problem, a proposed solution and a verification of it.\n"
    + _PROBLEM_AND_SOLUTION
    + _block("VERIFICATION", "verification")
    + """
Use the verification to help you solve the problem correctly.

Give your final answer as \\boxed{{answer}}."""
)

RLAIF_TEMPLATE = (
    "Below are a math problem and two solutions, both with the correct final answer. Choose the"
    " one you prefer.\n"
    + _block("PROBLEM", "problem")
    + _block("SOLUTION 1", "first")
    + _block("SOLUTION 2", "second")
    + """
Judge them on, in order of priority:
- Conciseness: is the solution too long or too short?
- Clarity: is it easy to follow?
- Correctness: is the reasoning sound? The final answers were checked already, but the \
reasoning may still contain mistakes.

Answer \\boxed{{1}} for the first solution or \\boxed{{2}} for the second."""
)


def _chat(user: str) -> list[Message]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def judge_messages(problem: str, solution: str) -> list[Message]:
    """Ask the policy to verify `solution`, answering \\boxed{True} or \\boxed{False}."""
    return _chat(JUDGE_TEMPLATE.format(problem=problem, solution=solution))


def retry_messages(problem: str, solution: str, verification: str) -> list[Message]:
    """Ask the policy to solve `problem` again, helped by its own verification."""
    text = RETRY_TEMPLATE.format(problem=problem, solution=solution, verification=verification)
    return _chat(text)


def rlaif_messages(problem: str, first: str, second: str) -> list[Message]:
    """Ask which of two correct solutions is better, answering \\boxed{1} or \\boxed{2}."""
    return _chat(RLAIF_TEMPLATE.format(problem=problem, first=first, second=second))
