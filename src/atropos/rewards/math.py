"""Math answers: extracting and checking final answers with math-verify, and `accuracy`.

math-verify (the `envs` extra) is imported on first use, not with this module. Its timeouts use
`signal.alarm`, which only works in the main thread; elsewhere parsing runs without one.

>>> gsm8k_gold("She pays 2 * 500 = 1,000 dollars.\\n#### 1,000")
'1000'
>>> after_think("<think>maybe 41?</think> It is 42.")
' It is 42.'
>>> accuracy("<think>6 * 7</think> The answer is \\\\boxed{42}.", answer="#### 42")
1.0
>>> accuracy("$42$", answer=42), accuracy("42.0", answer="42"), accuracy("", answer="42")
(1.0, 1.0, 0.0)
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from atropos.install import install_hint
from atropos.rewards.registry import Completion, reward, text_of

__all__ = [
    "accuracy",
    "after_think",
    "count_boxed",
    "equivalent",
    "gsm8k_correct",
    "gsm8k_gold",
    "is_correct",
    "parse_answer",
    "parse_boxed",
    "parse_gold",
]

_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_TIMEOUT = 5  # seconds per parse or comparison (main thread only)


def _mv() -> Any:
    try:
        import math_verify
    except ImportError:
        raise ImportError(f"the math rewards need math-verify: {install_hint('envs')}") from None
    return math_verify


def _timeout() -> int | None:
    return _TIMEOUT if threading.current_thread() is threading.main_thread() else None


def after_think(text: str) -> str:
    """The text after the last `</think>` (all of it when there is none)."""
    return text.rsplit("</think>", 1)[-1]


def gsm8k_gold(answer: str) -> str:
    """GSM8K's gold answer: the text after the last `#` of the answer, commas removed."""
    return str(answer).split("#")[-1].replace(",", "").strip()


def count_boxed(text: str) -> int:
    r"""How many `\boxed{` answers `text` holds."""
    return len(_BOXED.findall(text))


@lru_cache(maxsize=8192)
def parse_gold(gold: str) -> tuple[Any, ...]:
    r"""A gold answer parsed by math-verify as `\boxed{gold}` (empty when it cannot be parsed).

    >>> parse_gold("18")[0], parse_gold("")
    (18, ())
    """
    if not gold.strip():
        return ()
    mv = _mv()
    text = gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"
    return tuple(mv.parse(text, extraction_mode="first_match", parsing_timeout=_timeout()))


def parse_boxed(text: str) -> list[Any]:
    r"""Upstream gsm8k's extraction: `\boxed{}` first, LaTeX (no nits, no malformed operators,
    basic LaTeX, units), and nothing without an anchor ("answer is", `\boxed`)."""
    mv = _mv()
    from latex2sympy2_extended import NormalizationConfig

    norm = NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True
    )
    config = mv.LatexExtractionConfig(
        normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=False
    )
    found = mv.parse(
        text, extraction_config=[config], extraction_mode="first_match", parsing_timeout=_timeout()
    )
    return list(found)


def parse_answer(text: str) -> list[Any]:
    r"""A lenient extraction: `\boxed{}` first, then any LaTeX or plain expression (`$42$`,
    `42.0`, "the answer is 42"); inside the last `<answer>...</answer>` when there is one; a
    GSM8K-style `#### 42` when nothing is boxed."""
    mv = _mv()
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        text = tagged[-1]
    if "####" in text and "\\boxed" not in text:
        text = text.rsplit("####", 1)[-1]
    configs = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]
    return list(mv.parse(text, extraction_config=configs, parsing_timeout=_timeout()))


def _number(x: Any) -> float | None:
    if isinstance(x, str) or not getattr(x, "is_number", False):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def equivalent(gold: Sequence[Any], pred: Sequence[Any], tolerance: float = 0.0) -> bool:
    """Whether math-verify says `pred` equals `gold` (both parsed), or both are numbers within
    `tolerance` (relative for numbers above 1 in size)."""
    if not gold or not pred:
        return False
    if _mv().verify(list(gold), list(pred), timeout_seconds=_timeout()):
        return True
    if tolerance <= 0:
        return False
    golds = [g for g in map(_number, gold) if g is not None]
    preds = [p for p in map(_number, pred) if p is not None]
    return any(
        math.isclose(g, p, rel_tol=tolerance, abs_tol=tolerance) for g in golds for p in preds
    )


def gsm8k_correct(answer: str, completion: str) -> bool:
    r"""Upstream gsm8k's check: the completion's text after its last `</think>`, read by
    `parse_boxed`, equals the gold of the GSM8K `answer` (`gsm8k_gold`, as `\boxed{gold}`).

    >>> gsm8k_correct("2 + 2 = 4\n#### 4", "<think>2 + 2</think> \\boxed{4}")
    True
    >>> gsm8k_correct("#### 4", "<think>\\boxed{4}</think> 5"), gsm8k_correct("#### 4", "4")
    (False, False)
    """
    return equivalent(parse_gold(gsm8k_gold(answer)), parse_boxed(after_think(completion)))


def _gold_of(answer: object) -> tuple[Any, ...]:
    """The gold answer parsed, trying GSM8K's `####`, then `\\boxed{}`, then plain text."""
    text = str(answer).strip()
    if "####" in text:
        text = gsm8k_gold(text)
    parsed = parse_gold(text)
    if not parsed and "\\boxed" not in text:
        parsed = tuple(parse_answer(text))
    return parsed


def is_correct(completion: str, answer: object, tolerance: float = 1e-6) -> bool:
    """Whether `completion`'s final answer equals `answer` (leniently extracted; no think
    handling)."""
    return equivalent(_gold_of(answer), parse_answer(completion), tolerance)


@reward("accuracy")
def accuracy(
    completion: Completion,
    *,
    answer: object = None,
    tolerance: float = 1e-6,
    split_on_think_tag: bool = True,
    max_boxed_threshold: int = 6,
) -> float:
    r"""1.0 when the completion's final answer equals the gold `answer`, else 0.0.

    Args:
        answer: the gold answer: a number, a short answer (`"1,000"`, `"\frac{1}{2}"`), a
            boxed one, or a GSM8K solution ending `#### 42`.
        tolerance: numbers this close count as equal (relative above 1, absolute below).
        split_on_think_tag: judge only the text after the last `</think>`; a completion that
            opens `<think>` and never closes it has given no answer (0.0).
        max_boxed_threshold: more `\boxed{}` answers than this scores 0.0 (answer spraying).

    Several boxed answers that differ are read as a set, which matches no single gold answer.

    >>> accuracy(r"\boxed{1,000}", answer="1000"), accuracy("#### 1000", answer="1,000")
    (1.0, 1.0)
    >>> accuracy(r"\boxed{12} or \boxed{42}", answer="42")
    0.0
    >>> accuracy("<think>It is \\boxed{42}", answer="42")
    0.0
    """
    if answer is None:
        raise ValueError("accuracy needs the gold answer (answer=...)")
    text = text_of(completion)
    if split_on_think_tag:
        if "<think>" in text and "</think>" not in text:
            return 0.0
        text = after_think(text)
    if not text.strip() or count_boxed(text) > max_boxed_threshold:
        return 0.0
    return 1.0 if is_correct(text, answer, tolerance) else 0.0
