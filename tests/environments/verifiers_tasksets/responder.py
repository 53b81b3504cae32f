"""The policy of the verifiers tests, for the fake inference server (`--responder`).

Sums: answers 'The answer is N.', right on every other call and one too many on the others
(mixed groups). Moons: calls the `moons` tool, then answers with the number the tool returned
(right), or on every third answer one more (wrong). Deterministic given the call order.
"""

from __future__ import annotations

import itertools
import json
import re

_SUM = re.compile(r"What is (\d+) \+ (\d+)\?")
_MOONS = re.compile(r"How many moons does (\w+) have\?")
_TOOL_TURN = "<|im_start|>tool"
_sums = itertools.count()
_moons = itertools.count()


def respond(prompt: str) -> str | None:
    found = _SUM.findall(prompt)
    if found:
        a, b = found[-1]
        return f"The answer is {int(a) + int(b) + next(_sums) % 2}."
    planet = _MOONS.findall(prompt)
    if not planet:
        return None
    if _TOOL_TURN not in prompt:
        call = {"name": "moons", "arguments": {"planet": planet[-1]}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    tool_text = prompt.rsplit(_TOOL_TURN, 1)[1]
    count = int((re.findall(r"\d+", tool_text) or ["0"])[0])
    answer = count + (next(_moons) % 3 == 2)
    return f"The answer is {answer}."
