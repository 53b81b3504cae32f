"""Instruction checks on a response's form: lists, highlights, sections, JSON, case, quoting.

Each check takes the response text first, then the RLVR-IFeval arguments by name.

>>> verify_bullet_points("Two things:\\n* milk\\n- eggs", 2)
True
>>> validate_highlighted_sections("*one* and **two**", 2)
True
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from atropos.environments.common.ifeval.registry import as_int, check, compare

__all__ = [
    "DEFAULT_OPTIONS",
    "validate_choice",
    "validate_end",
    "validate_highlighted_sections",
    "validate_json_format",
    "validate_lowercase",
    "validate_no_commas",
    "validate_quotation",
    "validate_repeat_prompt",
    "validate_sections",
    "validate_start",
    "validate_title",
    "validate_two_responses",
    "validate_uppercase",
    "verify_bullet_points",
]

DEFAULT_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_BULLET = re.compile(r"^[ \t]*[*-][ \t]+\S.*$", re.MULTILINE)
_DIVIDER = re.compile(r"^[ \t]*\*[ \t]*\*[ \t]*\*[ \t]*$")
_FENCE = re.compile(r"^```[A-Za-z]*[ \t]*\n?|\n?```$")


@check("verify_bullet_points")
def verify_bullet_points(text: str, N: Any) -> bool:
    """Exactly N markdown bullet points (lines starting with `* ` or `- `)."""
    bullets = [b for b in _BULLET.findall(text) if not _DIVIDER.match(b)]
    return len(bullets) == as_int(N, "N")


@check("validate_title")
def validate_title(text: str) -> bool:
    """A non-empty title in double angular brackets, like <<A Day Out>>."""
    return re.search(r"<<[^\n<>]*[^\s<>][^\n<>]*>>", text) is not None


def _options(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            value = [value]
        if isinstance(value, str):
            value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"options must be a list of phrases, got {value!r}")
    return [str(v).strip() for v in value if str(v).strip()]


def _phrase(value: Any, what: str) -> str:
    phrase = str(value).strip().lower()
    if not phrase:
        raise ValueError(f"{what} is empty")
    return phrase


@check("validate_choice")
def validate_choice(text: str, options: Any = DEFAULT_OPTIONS) -> bool:
    """The response contains one of the options (e.g. "My answer is yes."), as IFEval."""
    return any(option in text for option in _options(options))


@check("validate_highlighted_sections")
def validate_highlighted_sections(text: str, N: Any) -> bool:
    """At least N markdown highlights (*one line* or **one line**, not empty)."""
    return len(re.findall(r"\*{1,2}[^\n*]*[^\s*][^\n*]*\*{1,2}", text)) >= as_int(N, "N")


@check("validate_sections")
def validate_sections(
    text: str, N: Any, section_splitter: str, quantifier: str = "exactly"
) -> bool:
    """`quantifier` N sections, each starting with the splitter and a number ("SECTION 1")."""
    splitter = str(section_splitter).strip()
    if not splitter:
        raise ValueError("section_splitter is empty")
    found = re.findall(rf"(?<!\w){re.escape(splitter)}\s*\d+", text)
    return compare(len(found), N, quantifier)


@check("validate_json_format")
def validate_json_format(text: str) -> bool:
    """The whole response is JSON (a surrounding markdown code fence is allowed)."""
    body = _FENCE.sub("", text.strip()).strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


@check("validate_repeat_prompt")
def validate_repeat_prompt(text: str, original_prompt: str) -> bool:
    """The response starts by repeating the request word for word (case-insensitive)."""
    return text.strip().lower().startswith(_phrase(original_prompt, "original_prompt"))


@check("validate_two_responses")
def validate_two_responses(text: str) -> bool:
    """Two different, non-empty responses separated by six asterisks (******)."""
    parts = [p.strip() for p in text.split("******")]
    if parts and not parts[0]:
        parts.pop(0)
    if parts and not parts[-1]:
        parts.pop()
    return len(parts) == 2 and all(parts) and parts[0] != parts[1]


@check("validate_uppercase")
def validate_uppercase(text: str) -> bool:
    """Capital letters only (and at least one)."""
    return text.isupper()


@check("validate_lowercase")
def validate_lowercase(text: str) -> bool:
    """Lowercase letters only (and at least one)."""
    return text.islower()


@check("validate_end")
def validate_end(text: str, end_phrase: str) -> bool:
    """The response ends with the exact phrase (case-insensitive), nothing after it."""
    return text.strip().lower().endswith(_phrase(end_phrase, "end_phrase"))


@check("validate_start")
def validate_start(text: str, start_phrase: str) -> bool:
    """The response starts with the phrase (case-insensitive). Ours; not in RLVR-IFeval."""
    return text.strip().lower().startswith(_phrase(start_phrase, "start_phrase"))


@check("validate_quotation")
def validate_quotation(text: str) -> bool:
    """The whole response is wrapped in double quotation marks."""
    body = text.strip()
    return len(body) > 1 and body[0] == '"' and body[-1] == '"'


@check("validate_no_commas")
def validate_no_commas(text: str) -> bool:
    """No commas at all."""
    return "," not in text
