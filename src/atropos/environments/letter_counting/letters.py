"""Letter-counting tasks: the ten tiers, item generation, strict answer parsing; the curriculum
(`Curriculum`) is the shared one of `common/curriculum.py`.

Used by `atropos.environments.letter_counting`; plain functions and dataclasses, no I/O
beyond reading the word list.

>>> rng = random.Random(0)
>>> item = make_item(1, ["banana"], rng)
>>> item["text"], item["letters"], item["expected"], item["level"]
('banana', ['n'], 2, 1)
>>> item["prompt"].splitlines()[0]
'How many ns are in the string banana?'
>>> score_answer("<think>b-a-n-a-n-a</think> <answer>3</answer>", 3)
1.0
>>> score_answer('<think>...</think><answer>{"a": 3, "n": 2}</answer>', {"a": 3, "n": 2})
1.0
>>> score_answer("<answer>3</answer>", 3)  # no thinking
0.0
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from atropos.environments.common.curriculum import Curriculum
from atropos.environments.common.data_loading import data_path
from atropos.rewards.text import split_think, tagged

__all__ = [
    "TIERS",
    "Curriculum",
    "Expected",
    "Tier",
    "make_item",
    "parse_answer",
    "parse_expected",
    "pick_letters",
    "question",
    "read_words",
    "score_answer",
    "split_words",
]

Expected = int | dict[str, int]


@dataclass(frozen=True)
class Tier:
    """One difficulty tier: text length, how often and how many letters are asked for."""

    min_length: int
    max_length: int
    multi_letter_probability: float
    min_letters: int
    max_letters: int
    random_string: bool


TIERS = {
    1: Tier(3, 8, 0.0, 1, 1, False),
    2: Tier(5, 12, 0.5, 1, 2, False),
    3: Tier(8, 18, 0.6, 2, 3, False),
    4: Tier(10, 25, 0.8, 3, 5, False),
    5: Tier(15, 35, 0.9, 5, 8, False),
    6: Tier(40, 80, 1.0, 8, 12, True),
    7: Tier(80, 150, 1.0, 12, 20, True),
    8: Tier(150, 250, 1.0, 18, 30, True),
    9: Tier(250, 400, 1.0, 25, 40, True),
    10: Tier(400, 500, 1.0, 35, 50, True),  # at most 26 distinct letters exist
}


def read_words(path: str | None = None) -> list[str]:
    """The word list (one per line; lower-case alphabetic words of 3-30 letters are kept)."""
    with open(path or data_path("letter_counting", "words.txt"), encoding="utf-8") as f:
        words = (line.strip().lower() for line in f)
        return [w for w in words if w.isascii() and w.isalpha() and 3 <= len(w) <= 30]


def split_words(words: list[str], seed: int = 42) -> tuple[list[str], list[str]]:
    """(train, held out): the words shuffled with `seed`, 95% / 5%."""
    shuffled = list(words)
    random.Random(seed).shuffle(shuffled)
    cut = int(0.95 * len(shuffled))
    return shuffled[:cut], shuffled[cut:]


def pick_letters(text: str, n: int, rng: random.Random) -> list[str]:
    """`n` distinct letters (at most 26), each from those present in `text` with a
    probability drawn once from [0.3, 0.9], else from those absent (whichever pool is left)."""
    present = sorted(set(text) & set(string.ascii_lowercase))
    absent = sorted(set(string.ascii_lowercase) - set(present))
    bias = rng.uniform(0.3, 0.9)
    letters = []
    for _ in range(n):
        if not present and not absent:
            break
        pool = present if present and (not absent or rng.random() < bias) else absent
        letters.append(pool.pop(rng.randrange(len(pool))))
    return letters


def question(text: str, letters: list[str]) -> str:
    """The user prompt asking for `letters` in `text`."""
    if len(letters) == 1:
        return (
            f"How many {letters[0]}s are in the string {text}?\n\n"
            "Provide your answer in the format: <answer>{number}</answer>"
        )
    quoted = [f"'{letter}'" for letter in letters]
    listed = f"{quoted[0]} and {quoted[1]}" if len(quoted) == 2 else ", ".join(quoted[:-1])
    if len(quoted) > 2:
        listed += f", and {quoted[-1]}"
    example = json.dumps({letter: 0 for letter in letters})
    return (
        f"Count the occurrences of the letters {listed} in the string {text}\n\n"
        f"Provide your answer as JSON in the format: <answer>{example}</answer>"
    )


def make_item(level: int, words: list[str], rng: random.Random) -> dict[str, Any]:
    """A generated item at tier `level`: prompt, text, letters, expected answer, level."""
    tier = TIERS[level]
    fits = [w for w in words if tier.min_length <= len(w) <= tier.max_length]
    if tier.random_string or not fits:
        length = rng.randint(tier.min_length, tier.max_length)
        text = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
    else:
        text = rng.choice(fits)
    n = 1
    if rng.random() < tier.multi_letter_probability:
        n = rng.randint(max(2, tier.min_letters), tier.max_letters)
    letters = pick_letters(text, n, rng)
    counts = {letter: text.count(letter) for letter in letters}
    expected: Expected = counts[letters[0]] if len(letters) == 1 else counts
    prompt = question(text, letters)
    return {
        "prompt": prompt,
        "text": text,
        "letters": letters,
        "expected": expected,
        "level": level,
    }


def parse_answer(completion: str, multiple: bool) -> Expected | None:
    """The answer of a well-formed completion (one think block, then exactly one <answer>
    holding a whole number, or a JSON object of whole numbers), else None."""
    after = split_think(completion)
    if after is None or after.count("<answer>") != 1:
        return None
    blocks = tagged(after, "answer")
    if len(blocks) != 1:
        return None
    body = blocks[0].strip()
    if not multiple:
        return int(body) if re.fullmatch(r"\d+", body) else None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or any(type(v) is not int for v in value.values()):
        return None
    return cast(dict[str, int], value)


def parse_expected(answer: Any) -> Expected:
    """An eval row's `Answer`: a whole number, or a JSON object of them (either may be text).

    >>> parse_expected("3"), parse_expected('{"a": 1}'), parse_expected(4)
    (3, {'a': 1}, 4)
    """
    value = answer
    if isinstance(answer, str):
        try:
            value = json.loads(answer)
        except ValueError:
            value = None
    if type(value) is int or (
        isinstance(value, dict) and all(type(v) is int for v in value.values())
    ):
        return cast(Expected, value)
    raise ValueError(f"Answer {answer!r} is neither a whole number nor a JSON object of them")


def score_answer(completion: str, expected: Expected) -> float:
    """1.0 when the completion's answer equals `expected` (same letters, same counts)."""
    answer = parse_answer(completion, multiple=isinstance(expected, Mapping))
    return 1.0 if answer is not None and answer == expected else 0.0
