"""Exact values of arithmetic expressions, read without `eval`.

`exact_value` walks the expression's Python syntax tree and computes with `fractions.Fraction`,
so `1 / 3 * 3` is exactly 1. It reads numbers (whole, or decimals when `decimals`), the binary
operators `+ - * /` and `^` (a power; `**` too), unary minus and plus, and parentheses; a caller
may allow fewer operators. A power's exponent must be a whole number from 0 to 3, and no power
may grow past `MAX_BITS`, so no expression takes long to compute. Anything else raises
`ExpressionError`; a zero divisor raises `DivisionByZero`, which is both an `ExpressionError`
and a `ZeroDivisionError`. Used by `agent_tools` (its calculator tool), `infinimath` (problems
and their answers) and `mt_grpo` (its calculator tool); each formats the value its own way.

>>> exact_value("1 / 3 * 3"), exact_value("(-2)^3 + 0.5")
(Fraction(1, 1), Fraction(-15, 2))
>>> try:
...     exact_value("7 / 2", operators="+-*", decimals=False)
... except ExpressionError as err:
...     print(err)
only integers, + - * and parentheses
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction

__all__ = ["MAX_BITS", "MAX_POWER", "OPERATORS", "DivisionByZero", "ExpressionError", "exact_value"]

OPERATORS = "+-*/^"  # every binary operator read (^ is a power)
MAX_POWER = 3  # the largest exponent
MAX_BITS = 4096  # a power whose value would need more bits (numerator or denominator) is refused
_BINARY: dict[type[ast.operator], tuple[str, Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
}


class ExpressionError(ValueError):
    """Text that is not an expression `exact_value` reads (or that uses an operator the caller
    does not allow); the message says what is allowed."""


class DivisionByZero(ExpressionError, ZeroDivisionError):
    """An expression that divides by zero."""


def exact_value(expression: str, operators: str = OPERATORS, decimals: bool = True) -> Fraction:
    """The exact value of `expression` (see the module docstring).

    Args:
        expression: the text, e.g. `"12 + 7 * (3 - 4)"` or `"2^3"`.
        operators: the binary operators allowed, some of `+ - * / ^`.
        decimals: whether numbers may have decimals (`0.25`, `1e3`), else whole numbers only.

    Raises:
        ExpressionError: not such an expression, or one whose power is too large.
        DivisionByZero: a zero divisor.
    """
    numbers = "numbers" if decimals else "integers"
    allowed = f"only {numbers}, {' '.join(operators)} and parentheses"

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.Constant) and type(node.value) is float and decimals:
            if not math.isfinite(node.value):
                raise ExpressionError(f"a number too large: {_shown(expression)}")
            return Fraction(str(node.value))  # 0.1 is one tenth, not the float nearest it
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            inner = walk(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and "^" in operators:
            return _power(walk(node.left), walk(node.right))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            symbol, apply = _BINARY[type(node.op)]
            if symbol in operators:
                left, right = walk(node.left), walk(node.right)
                if symbol == "/" and right == 0:
                    raise DivisionByZero("division by zero")
                return apply(left, right)
        raise ExpressionError(allowed)

    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError(f"not an arithmetic expression: {_shown(expression)}") from None
    try:
        return walk(tree.body)
    except RecursionError:
        raise ExpressionError(f"nested too deeply: {_shown(expression)}") from None


def _shown(expression: str, most: int = 80) -> str:
    """The expression quoted for a message, cut to `most` characters."""
    return repr(expression if len(expression) <= most else expression[:most] + "...")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """`base ** exponent` for a whole exponent from 0 to `MAX_POWER`, within `MAX_BITS`."""
    if exponent.denominator != 1 or not 0 <= exponent <= MAX_POWER:
        raise ExpressionError(f"only whole powers up to {MAX_POWER}")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits * int(exponent) > MAX_BITS:
        raise ExpressionError(f"a power too large (over {MAX_BITS} bits)")
    return base ** int(exponent)
