"""Instruction checks on what a response says: keywords, letters, language, lengths, markers.

Each check takes the response text first, then the RLVR-IFeval arguments by name. Counting rules
(ours, written from the IFEval instruction definitions):

- a *word* is a whitespace-separated token holding a letter or digit;
- a *sentence* ends with `.`, `!` or `?` before whitespace or the end (after common
  abbreviations such as "Dr." or "e.g." it does not);
- *paragraphs* for `verify_paragraph_count` are separated by a markdown divider line (`* * *`
  or `***`); for `validate_paragraphs` by blank lines.

>>> validate_word_constraint("one two three - four", 4, "at least")
True
>>> verify_sentence_constraint("Dr. Smith is here. Is he? Yes!", 3, "exactly")
True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atropos.environments.common.ifeval.language import detects
from atropos.environments.common.ifeval.registry import as_int, check, compare

__all__ = [
    "count_sentences",
    "count_words",
    "validate_forbidden_words",
    "validate_frequency_capital_words",
    "validate_paragraphs",
    "validate_placeholders",
    "validate_response_language",
    "validate_word_constraint",
    "verify_keyword_frequency",
    "verify_keywords",
    "verify_letter_frequency",
    "verify_paragraph_count",
    "verify_postscript",
    "verify_sentence_constraint",
]

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st sr jr vs etc e.g i.e no fig approx dept est inc ltd co u.s".split()
)
_DIVIDER = re.compile(r"^[ \t]*\*[ \t]*\*[ \t]*\*[ \t]*$", re.MULTILINE)


def words_of(value: Any, what: str) -> list[str]:
    """A list of words from a JSON list or a comma-separated string."""
    if isinstance(value, str):
        items = [w.strip() for w in value.split(",")]
    elif isinstance(value, Sequence):
        items = [str(w).strip() for w in value]
    else:
        raise ValueError(f"{what} must be a list of words, got {value!r}")
    items = [w for w in items if w]
    if not items:
        raise ValueError(f"{what} is empty")
    return items


def _phrase(word: str) -> re.Pattern[str]:
    """`word` (or phrase) as a whole-word, case-insensitive pattern."""
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)


def count_words(text: str) -> int:
    """Whitespace-separated tokens holding a letter or digit.

    >>> count_words("Hello, world - 42 *")
    3
    """
    return sum(1 for token in text.split() if any(ch.isalnum() for ch in token))


def count_sentences(text: str) -> int:
    """Sentences ending in `.`, `!` or `?` (an unterminated last one counts too).

    >>> count_sentences("It works. Really? See e.g. this one")
    3
    """
    pieces = [p for p in re.split(r"(?<=[.!?])\s+", text.strip()) if p.strip()]
    count = 0
    for i, piece in enumerate(pieces):
        last = piece.split()[-1].rstrip(".").lower() if piece.split() else ""
        if i + 1 < len(pieces) and last in _ABBREVIATIONS:
            continue  # "Dr. Smith": the sentence goes on
        if any(ch.isalnum() for ch in piece):
            count += 1
    return count


@check("verify_keywords")
def verify_keywords(text: str, keyword_list: Any) -> bool:
    """Every keyword appears (case-insensitive, anywhere, as IFEval)."""
    lowered = text.lower()
    return all(k.lower() in lowered for k in words_of(keyword_list, "keyword_list"))


@check("verify_keyword_frequency")
def verify_keyword_frequency(text: str, word: str, N: Any, quantifier: str = "exactly") -> bool:
    """The word (whole word, case-insensitive) appears `quantifier` N times."""
    if not str(word).strip():
        raise ValueError("word is empty")
    return compare(len(_phrase(str(word).strip()).findall(text)), N, quantifier)


@check("validate_forbidden_words")
def validate_forbidden_words(text: str, forbidden_words: Any) -> bool:
    """None of the words appears as a whole word (case-insensitive)."""
    return not any(_phrase(w).search(text) for w in words_of(forbidden_words, "forbidden_words"))


@check("verify_letter_frequency")
def verify_letter_frequency(text: str, letter: str, N: Any, quantifier: str = "exactly") -> bool:
    """The letter (case-insensitive) appears `quantifier` N times."""
    if len(str(letter)) != 1 or not str(letter).isalpha():
        raise ValueError(f"letter must be a single letter, got {letter!r}")
    return compare(text.lower().count(str(letter).lower()), N, quantifier)


@check("validate_response_language")
def validate_response_language(text: str, language: str) -> bool:
    """The response is written in `language` (ISO 639-1; offline rules, see `language.py`)."""
    return detects(text, language)


@check("validate_word_constraint")
def validate_word_constraint(text: str, N: Any, quantifier: str) -> bool:
    """The response has `quantifier` N words."""
    return compare(count_words(text), N, quantifier)


@check("verify_sentence_constraint")
def verify_sentence_constraint(text: str, N: Any, quantifier: str) -> bool:
    """The response has `quantifier` N sentences."""
    return compare(count_sentences(text), N, quantifier)


@check("verify_paragraph_count")
def verify_paragraph_count(text: str, N: Any) -> bool:
    """Exactly N non-empty paragraphs separated by markdown dividers (`* * *`)."""
    parts = [p.strip() for p in _DIVIDER.split(text)]
    while parts and not parts[0]:
        parts.pop(0)
    while parts and not parts[-1]:
        parts.pop()
    return all(parts) and len(parts) == as_int(N, "N")


@check("validate_paragraphs")
def validate_paragraphs(text: str, N: Any, first_word: str, i: Any) -> bool:
    """Exactly N paragraphs separated by blank lines, the i-th (from 1) starting with
    `first_word` (case-insensitive, punctuation around it ignored)."""
    n, nth = as_int(N, "N"), as_int(i, "i")
    if not 1 <= nth <= n:
        raise ValueError(f"i must be between 1 and N ({n}), got {nth}")
    paragraphs = [p.strip() for p in re.split(r"\n[ \t]*\n", text.strip()) if p.strip()]
    if len(paragraphs) != n:
        return False
    first = re.sub(r"^[^\w]+|[^\w'’-]+$", "", paragraphs[nth - 1].split()[0])
    return first.lower() == str(first_word).strip().lower()


@check("validate_placeholders")
def validate_placeholders(text: str, N: Any) -> bool:
    """At least N placeholders in square brackets, like [address]."""
    return len(re.findall(r"\[[^\[\]\n]*\S[^\[\]\n]*\]", text)) >= as_int(N, "N")


@check("verify_postscript")
def verify_postscript(text: str, postscript_marker: str) -> bool:
    """A line starting with the marker (e.g. "P.S."; case and a space after a period are
    ignored) followed by some text."""
    marker = str(postscript_marker).strip()
    if not marker:
        raise ValueError("postscript_marker is empty")
    pattern = re.escape(marker).replace(r"\.", r"\.\s?")
    return re.search(rf"(?im)^[\s*_#>]*{pattern}[\s*_:]*\w", text) is not None


@check("validate_frequency_capital_words")
def validate_frequency_capital_words(text: str, N: Any, quantifier: str) -> bool:
    """Words in capital letters only ("NASA", "I") appear `quantifier` N times."""
    return compare(len(re.findall(r"\b[A-Z]+\b", text)), N, quantifier)
