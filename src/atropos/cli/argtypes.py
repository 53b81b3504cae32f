"""Argument types of the command line (`type=` of `add_argument`): a bad value is a usage error.

>>> positive_int("3"), non_negative_int("0"), non_negative_float("0.5"), positive_seconds("2")
(3, 0, 0.5, 2.0)
>>> positive_int("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a positive integer, got 0
"""

from __future__ import annotations

import argparse

__all__ = ["non_negative_float", "non_negative_int", "positive_int", "positive_seconds"]


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value
