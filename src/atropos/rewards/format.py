"""Rewards for the shape of a completion: tags (`format`, `think_format`) and `reasoning_steps`.

>>> format_reward("<think>6 * 7 = 42</think><answer>42</answer>", require_all_tags=True)
1.0
>>> think_format("<think>6 * 7 = 42</think> 42"), think_format("42")
(0.5, 0.0)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from atropos.rewards.registry import Completion, override_weights, reward, text_of

__all__ = ["STEP_PATTERNS", "format_reward", "has_tag", "reasoning_steps", "think_format"]


def has_tag(text: str, tag: str, case_sensitive: bool = False) -> bool:
    """Whether `text` holds `<tag>...</tag>` with something other than whitespace inside."""
    flags = re.DOTALL | (0 if case_sensitive else re.IGNORECASE)
    name = re.escape(tag)
    return re.search(rf"<{name}>\s*\S.*?</{name}>", text, flags) is not None


@reward("format")
def format_reward(
    completion: Completion,
    *,
    answer: object = None,
    preferred_tags: Sequence[str] = ("think", "answer"),
    require_all_tags: bool = False,
    case_sensitive: bool = False,
) -> float:
    """1.0 when the completion uses the preferred tags, else 0.0.

    Args:
        preferred_tags: tag names; a tag counts when `<tag>...</tag>` holds some text.
        require_all_tags: every tag must be there (default: any one is enough).
        case_sensitive: `<THINK>` is not `<think>`.

    >>> format_reward("<think>hm</think> 42"), format_reward("<THINK>hm</THINK>")
    (1.0, 1.0)
    >>> format_reward("<THINK>hm</THINK>", case_sensitive=True), format_reward("<think></think>")
    (0.0, 0.0)
    >>> format_reward("<think>hm</think> 42", require_all_tags=True)
    0.0
    """
    if isinstance(preferred_tags, str):
        preferred_tags = [preferred_tags]
    text = text_of(completion)
    found = [has_tag(text, tag, case_sensitive) for tag in preferred_tags]
    ok = all(found) if require_all_tags else any(found)
    return 1.0 if found and ok else 0.0


@reward("think_format", aliases=("formatreasoning", "format_reasoning"))
def think_format(
    completion: Completion,
    *,
    answer: object = None,
    reward_value: float = 0.5,
    require_thinking: bool = True,
    require_response: bool = True,
    allow_multiple_thinking: bool = False,
) -> float:
    """`reward_value` for R1's format: one `<think>...</think>` block opening the completion,
    then an answer; else 0.0 (upstream's `formatreasoning`).

    Args:
        reward_value: the score of a well-formed completion.
        require_thinking: the completion must open with a non-empty think block.
        require_response: some text must follow the last `</think>`.
        allow_multiple_thinking: more than one think block is allowed.

    >>> think_format("<think>a</think><think>b</think> 42")
    0.0
    >>> think_format("<think>a</think><think>b</think> 42", allow_multiple_thinking=True)
    0.5
    >>> think_format("<think>6 * 7</think>", require_response=False, reward_value=1.0)
    1.0
    """
    text = text_of(completion)
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens != closes or (opens > 1 and not allow_multiple_thinking):
        return 0.0
    if require_thinking and not re.match(r"\s*<think>\s*\S.*?</think>", text, re.DOTALL):
        return 0.0
    if require_response and not text.rsplit("</think>", 1)[-1].strip():
        return 0.0
    return float(reward_value)


STEP_PATTERNS: dict[str, tuple[str, float]] = {
    # name: (regular expression, case-insensitive; default weight)
    "step_labels": (r"\bstep\s*\d+", 1.0),
    "numbered": (r"(?m)^\s*\d+[.)]\s", 1.0),
    "bullets": (r"(?m)^\s*[-*\u2022]\s", 0.5),
    "sequencing": (
        r"\b(?:first(?:ly)?|second(?:ly)?|third(?:ly)?|next|then|finally|lastly)\b",
        0.5,
    ),
    "connectives": (r"\b(?:therefore|thus|hence|because|since|so)\b", 0.5),
    "calculations": (r"\d\s*[-+*/\u00d7]\s*\d[\d.,]*\s*=", 0.5),
}


@reward("reasoning_steps", aliases=("reasoningsteps",))
def reasoning_steps(
    completion: Completion,
    *,
    answer: object = None,
    min_words: int = 10,
    min_steps: float = 3,
    base_score: float = 0.1,
    pattern_weights: Mapping[str, float] | None = None,
) -> float:
    """How step-by-step the reasoning looks, from 0.0 to 1.0.

    Each match of a `STEP_PATTERNS` pattern (step labels, numbered lines, bullets, sequencing
    words, connectives, worked calculations) counts its weight. A text of at least `min_words`
    words scores `base_score`, rising linearly to 1.0 when the weighted count reaches
    `min_steps`; a shorter text scores 0.0.

    Args:
        pattern_weights: weights replacing the defaults, by pattern name (0 turns one off).

    >>> reasoning_steps("42")
    0.0
    >>> reasoning_steps("Step 1: 6 * 7 = 42. Step 2: check it again. Finally, the answer is 42.")
    1.0
    >>> reasoning_steps("I am quite sure that the number you are looking for is 42.")
    0.1
    """
    defaults = {name: weight for name, (_, weight) in STEP_PATTERNS.items()}
    weights = override_weights(defaults, pattern_weights, "reasoning_steps", "pattern")
    text = text_of(completion)
    if len(text.split()) < min_words:
        return 0.0
    found = sum(
        weights[name] * len(re.findall(pattern, text, re.IGNORECASE))
        for name, (pattern, _) in STEP_PATTERNS.items()
    )
    progress = min(1.0, found / min_steps) if min_steps > 0 else 1.0
    return base_score + (1.0 - base_score) * progress
