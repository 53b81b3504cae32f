"""`common.expressions.exact_value`: exact arithmetic without `eval`, the operators a caller
allows, one error type (and a zero divisor that is also a ZeroDivisionError)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atropos.environments.common.expressions import (
    MAX_BITS,
    DivisionByZero,
    ExpressionError,
    exact_value,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 - (2 - 3)", 2),
        ("7 / 2 * 4", 14),
        ("1 / 3", Fraction(1, 3)),
        ("1 / 3 * 3", 1),  # exact: no float rounding
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1e3 / 8", 125),
        ("(-2)^3 + 1", -7),
        ("-2^2", -4),  # the power binds tighter than the minus, as written in maths
        ("2 ** 3", 8),
        ("+3 - -4", 7),
        ("12 + 7 * (3 - 4)", 5),
    ],
)
def test_values_are_exact(text: str, value: Fraction) -> None:
    assert exact_value(text) == value


@pytest.mark.parametrize(
    "text",
    ["__import__('os')", "x + 1", "2 % 3", "2 // 3", "1 < 2", "abs(-1)", "[1]", "'1'", "True + 1"],
)
def test_anything_but_arithmetic_is_refused(text: str) -> None:
    with pytest.raises(ExpressionError, match="only numbers"):
        exact_value(text)


def test_syntax_errors_and_deep_nesting_are_expression_errors() -> None:
    for text in ("1 +", "", "(1", "1,000"):
        with pytest.raises(ExpressionError):
            exact_value(text)
    with pytest.raises(ExpressionError, match="not an arithmetic expression: '1 \\+'"):
        exact_value("1 +")
    with pytest.raises(ExpressionError):
        exact_value("+".join(["1"] * 50_000))
    long = "(" * 400 + "1" + ")" * 400
    with pytest.raises(ExpressionError) as caught:
        exact_value(long)
    assert len(str(caught.value)) < 150  # the message quotes only the start


def test_a_zero_divisor_is_both_error_types() -> None:
    with pytest.raises(DivisionByZero, match="division by zero") as caught:
        exact_value("1 / (2 - 2)")
    assert isinstance(caught.value, ZeroDivisionError) and isinstance(caught.value, ValueError)


def test_powers_are_whole_small_and_bounded() -> None:
    assert exact_value("((9^3)^3)^3") == 9**27
    for text in ("2 ** 100", "2^(1/2)", "2^-1", "9^3^3"):
        with pytest.raises(ExpressionError, match="whole powers up to 3"):
            exact_value(text)
    assert 9**729 < 2**MAX_BITS < 9**2187
    with pytest.raises(ExpressionError, match="power too large"):
        exact_value("(((((((9^3)^3)^3)^3)^3)^3)^3)")  # 9^2187: more bits than MAX_BITS
    with pytest.raises(ExpressionError, match="too large"):
        exact_value("1e400")


def test_a_caller_allows_fewer_operators_and_whole_numbers_only() -> None:
    assert exact_value("2 * (3 + 4) - 1", operators="+-*", decimals=False) == 13
    with pytest.raises(ExpressionError, match=r"^only integers, \+ - \* and parentheses$"):
        exact_value("7 / 2", operators="+-*", decimals=False)
    with pytest.raises(ExpressionError, match="only integers"):
        exact_value("1.5 + 1", decimals=False)
    with pytest.raises(ExpressionError, match=r"^only numbers, \+ - \* / and parentheses$"):
        exact_value("2^3", operators="+-*/")


@given(
    st.integers(-(10**6), 10**6),
    st.sampled_from("+-*/"),
    st.integers(-(10**6), 10**6),
)
def test_one_operation_is_fraction_arithmetic(left: int, op: str, right: int) -> None:
    text = f"({left}) {op} ({right})"
    if op == "/" and right == 0:
        with pytest.raises(DivisionByZero):
            exact_value(text)
        return
    a, b = Fraction(left), Fraction(right)
    expected = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
    assert exact_value(text) == expected
