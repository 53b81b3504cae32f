"""The registry of instruction checks: names mapped to plain `check(text, **args) -> bool`.

Names and argument names are those of the RLVR-IFeval `ground_truth` records (`func_name`
plus `N`, `quantifier`, `keyword_list`, ...). A record carries every argument key, most of them
null, so a check is called with only the non-null arguments its signature accepts. A check
raises `ValueError` only for unusable arguments (an unknown quantifier or language), never for
the text; `verify` turns that into "not followed" and `validate` reports it up front.

>>> verify("validate_no_commas", "No commas here.", {"N": None, "word": None})
True
>>> verify("validate_no_commas", "   ", {})  # an empty answer follows no instruction
False
>>> try:
...     get("validate_no_comas")
... except UnknownCheck as e:
...     print(e)
no instruction check named 'validate_no_comas'; did you mean validate_no_commas?
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from atropos.names import did_you_mean

__all__ = [
    "CHECKS",
    "Check",
    "UnknownCheck",
    "accepted_args",
    "check",
    "compare",
    "get",
    "names",
    "validate",
    "verify",
]

Check = Callable[..., bool]
CHECKS: dict[str, Check] = {}
_MODULES = ("checks_content", "checks_format")
QUANTIFIERS = ("at least", "at most", "less than", "more than", "around", "exactly")


class UnknownCheck(LookupError):
    """No instruction check of that name; the message suggests the closest one."""


def check(name: str) -> Callable[[Check], Check]:
    """Register a function as the check `name` (its first parameter is the response text)."""

    def add(fn: Check) -> Check:
        if name in CHECKS and CHECKS[name] is not fn:
            raise ValueError(f"instruction check {name!r} is already registered")
        CHECKS[name] = fn
        return fn

    return add


@functools.cache
def _load() -> None:
    for module in _MODULES:
        importlib.import_module(f"atropos.environments.common.ifeval.{module}")


@functools.cache
def _params(fn: Check) -> tuple[inspect.Parameter, ...]:
    """The parameters of a check after the text."""
    return tuple(inspect.signature(fn).parameters.values())[1:]


def names() -> list[str]:
    """Every registered check name, sorted."""
    _load()
    return sorted(CHECKS)


def get(name: str) -> Check:
    """The check called `name`.

    Raises:
        UnknownCheck: no such check; the message names the closest one.
    """
    _load()
    try:
        return CHECKS[name]
    except KeyError:
        hint = did_you_mean(str(name), CHECKS) or f" (known: {', '.join(sorted(CHECKS))})"
        raise UnknownCheck(f"no instruction check named {name!r}{hint}") from None


def accepted_args(fn: Check, args: Mapping[str, Any]) -> dict[str, Any]:
    """The non-null entries of `args` that `fn` takes (by parameter name, the text excluded)."""
    return {p.name: args[p.name] for p in _params(fn) if args.get(p.name) is not None}


def validate(name: str, args: Mapping[str, Any]) -> None:
    """Check that `name` exists and that `args` can drive it, before any response is scored.

    Raises:
        UnknownCheck: the check does not exist.
        ValueError: a required argument is missing, or one is unusable.
    """
    fn = get(name)
    given = accepted_args(fn, args)
    missing = [p.name for p in _params(fn) if p.default is p.empty and p.name not in given]
    if missing:
        raise ValueError(f"{name} needs {', '.join(missing)}")
    try:
        fn("A dry run of the check.", **given)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: unusable arguments {given}: {e}") from None


def verify(name: str, text: str, args: Mapping[str, Any] | None = None) -> bool:
    """Whether `text` follows the instruction `name` with `args` (False for a blank text, or
    arguments the check cannot use)."""
    fn = get(name)
    if not text.strip():
        return False
    try:
        return bool(fn(text, **accepted_args(fn, args or {})))
    except (TypeError, ValueError):
        return False


def compare(actual: int, n: Any, quantifier: str | None = "exactly") -> bool:
    """Whether a count satisfies "`quantifier` `n`" ("around": within 10% of n, at least 1).

    >>> compare(9, 10, "around"), compare(8, 10, "around"), compare(3, 3, None)
    (True, False, True)
    >>> compare(3, 3, "roughly")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown quantifier 'roughly' (expected one of: at least, at most, ...)
    """
    target = as_int(n, "N")
    q = re.sub(r"\s+", " ", (quantifier or "exactly").strip().lower())
    if q == "at least":
        return actual >= target
    if q == "at most":
        return actual <= target
    if q == "less than":
        return actual < target
    if q == "more than":
        return actual > target
    if q == "around":
        return abs(actual - target) <= max(1, round(0.1 * target))
    if q in ("exactly", "equal to", "equal"):
        return actual == target
    known = ", ".join(QUANTIFIERS)
    raise ValueError(f"unknown quantifier {quantifier!r} (expected one of: {known})")


def as_int(value: Any, what: str) -> int:
    """`value` as an int (JSON numbers and digit strings), else ValueError naming `what`."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"{what} must be a whole number, got {value!r}")
