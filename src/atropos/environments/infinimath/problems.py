"""Arithmetic problems for `infinimath`: eight levels, seeded generation, exact values, and
reading a numeric answer.

A problem is an expression tree rendered as text with as few parentheses as its meaning
needs (`12 + 7 * (3 - 4)`; a negative number always in its own, `(-7)`; `^` a power). Its value
is the text's own, computed exactly by `value_of` (`common.expressions.exact_value` on whole
numbers; generation, the gold answer and the demo responder all use it). A level fixes the
operations, the size of the numbers, the count of terms, the nesting of parentheses, and
whether negative numbers, fractional results and powers occur (`LEVELS`).

>>> problem = generate(LEVELS[4], random.Random(0))
>>> problem.text, problem.answer
('66 + 63 - (62 - 46)', '113')
>>> parse_number("\\\\frac{-3}{4}"), parse_number("-0.75"), parse_number("3/4 apples")
(Fraction(-3, 4), Fraction(-3, 4), None)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction

from atropos.environments.common.expressions import exact_value

__all__ = [
    "LEVELS",
    "Level",
    "Problem",
    "answer_text",
    "generate",
    "parse_number",
    "same_value",
    "value_of",
]


@dataclass(frozen=True)
class Level:
    """What the problems of one level are made of."""

    ops: str  # the binary operations among + - * /
    digits: int  # numbers have up to this many digits
    terms: int  # numbers in the expression (a power counts as one)
    depth: int  # nesting of parentheses
    negatives: bool = False
    fractions: bool = False  # a division need not come out even
    powers: bool = False  # squares and cubes of one-digit numbers


LEVELS: dict[int, Level] = {
    1: Level("+-", 1, 2, 0),
    2: Level("+-", 2, 3, 0),
    3: Level("+-*", 2, 3, 0),
    4: Level("+-*", 2, 4, 1),
    5: Level("+-*/", 2, 4, 1),
    6: Level("+-*/", 3, 5, 2, negatives=True),
    7: Level("+-*/", 2, 5, 2, negatives=True, fractions=True),
    8: Level("+-*/", 3, 6, 3, negatives=True, fractions=True, powers=True),
}

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}


@dataclass(frozen=True)
class Num:
    """A whole number."""

    value: int


@dataclass(frozen=True)
class Op:
    """An operation (`+ - * / ^`) on two expressions."""

    op: str
    left: Num | Op
    right: Num | Op


@dataclass(frozen=True)
class Problem:
    """A generated problem: its text, its exact answer as text, and its nesting."""

    text: str
    answer: str
    depth: int


def value_of(text: str) -> Fraction:
    """The exact value of an expression written with whole numbers, `+ - * / ^` (whole powers
    up to 3), unary minus and parentheses (`common.expressions.exact_value`).

    Raises:
        ExpressionError: (a ValueError) anything else.
        DivisionByZero: (a ZeroDivisionError) a zero divisor.
    """
    return exact_value(text, decimals=False)


def _needs_parentheses(child: Num | Op, parent: Op, right: bool) -> bool:
    if isinstance(child, Num):
        return False
    mine, theirs = _PRECEDENCE[child.op], _PRECEDENCE[parent.op]
    return mine < theirs or (right and mine == theirs and parent.op in "-/") or parent.op == "^"


def render(node: Num | Op) -> str:
    """The expression as text, with the parentheses its meaning needs."""
    if isinstance(node, Num):
        return f"({node.value})" if node.value < 0 else str(node.value)
    parts = []
    for child, right in ((node.left, False), (node.right, True)):
        text = render(child)
        parts.append(f"({text})" if _needs_parentheses(child, node, right) else text)
    return f"{parts[0]}^{parts[1]}" if node.op == "^" else f"{parts[0]} {node.op} {parts[1]}"


def nesting(node: Num | Op) -> int:
    """How deep the parentheses of `render(node)` nest (a negative number's not counted)."""
    if isinstance(node, Num):
        return 0
    return max(
        nesting(child) + _needs_parentheses(child, node, right)
        for child, right in ((node.left, False), (node.right, True))
    )


def _number(level: Level, rng: random.Random) -> Num | Op:
    if level.powers and rng.random() < 0.25:
        base = rng.randint(2, 9) * (-1 if level.negatives and rng.random() < 0.3 else 1)
        return Op("^", Num(base), Num(rng.choice([2, 3])))
    value = rng.randint(1, 10**level.digits - 1)
    return Num(-value if level.negatives and rng.random() < 0.3 else value)


def _divisor(value: Fraction, level: Level, rng: random.Random) -> int | None:
    """A whole divisor of `value` (from 2 to the level's largest number), or None."""
    if value.denominator != 1:
        return None
    whole, top = abs(value.numerator), 10**level.digits - 1
    found = [d for d in range(2, min(top, whole or top) + 1) if whole % d == 0]
    return rng.choice(found) if found else None


def _build(level: Level, rng: random.Random, terms: int) -> Num | Op:
    if terms == 1:
        return _number(level, rng)
    op = rng.choice(level.ops)
    if op == "/" and not level.fractions:  # an even division: a divisor of the left side
        for _ in range(10):
            left = _build(level, rng, terms - 1)
            divisor = _divisor(value_of(render(left)), level, rng)
            if divisor is not None:
                return Op("/", left, Num(divisor))
        op = rng.choice([o for o in level.ops if o != "/"])
    split = rng.randint(1, terms - 1)
    return Op(op, _build(level, rng, split), _build(level, rng, terms - split))


def answer_text(value: Fraction) -> str:
    """A value as its answer is written: `-7`, `3/4`."""
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def generate(level: Level, rng: random.Random, tries: int = 400) -> Problem:
    """A problem of `level`, drawn with `rng`: the first of up to `tries` expressions whose
    parentheses nest exactly `level.depth` deep and whose answer stays readable (a denominator
    up to 1000, a size up to 10^(3 x digits)); failing that, the closest one found."""
    best: Problem | None = None
    for _ in range(tries):
        node = _build(level, rng, level.terms)
        text = render(node)
        try:
            value = value_of(text)
        except ZeroDivisionError:
            continue
        if value.denominator > 1000 or abs(value) > 10 ** (3 * level.digits):
            continue
        problem = Problem(text, answer_text(value), nesting(node))
        if problem.depth == level.depth:
            return problem
        if best is None or abs(problem.depth - level.depth) < abs(best.depth - level.depth):
            best = problem
    if best is None:
        raise RuntimeError(f"no problem found for {level} in {tries} tries")
    return best


_FRAC = re.compile(r"(-?)\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}")
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*-?\d+)?")


def parse_number(text: str) -> Fraction | None:
    """The number `text` states: a whole number, a decimal, `a/b` or LaTeX `\\frac{a}{b}`
    (dollar signs, spaces, thousands commas and a Unicode minus allowed); None otherwise."""
    text = text.strip().strip("$").strip().replace("\u2212", "-")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    if m := _FRAC.fullmatch(text):
        sign, top, bottom = m.groups()
        return None if int(bottom) == 0 else Fraction(int(top), int(bottom)) * (-1 if sign else 1)
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def same_value(stated: str, gold: str, tolerance: float = 1e-6) -> bool:
    """Whether `stated` is the number `gold` (a whole number or `a/b`): exactly, or, for a
    decimal, within `tolerance` of it (relative, at least absolute).

    >>> same_value("6/8", "3/4"), same_value("0.3333333", "1/3"), same_value("0.33", "1/3")
    (True, True, False)
    """
    found, want = parse_number(stated), Fraction(gold)
    if found is None:
        return False
    if found == want:
        return True
    decimal = "." in stated or "e" in stated.lower()
    return decimal and abs(found - want) <= tolerance * max(Fraction(1), abs(want))
