"""Argument types of the command line (`type=` of `add_argument`, a bad value is a usage
error), and `Parser`, the argparse parser of every `atropos` command: a misspelt flag or
command is named with the nearest known one ("did you mean"), on one line, exit status 2.

>>> positive_int("3"), non_negative_int("0"), non_negative_float("0.5"), positive_seconds("2")
(3, 0, 0.5, 2.0)
>>> positive_int("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a positive integer, got 0
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from atropos.names import did_you_mean

__all__ = [
    "CHECK_ARGS_HELP",
    "Parser",
    "non_negative_float",
    "non_negative_int",
    "positive_int",
    "positive_seconds",
    "usage_error",
]

_UNKNOWN_FROM = "_atropos_unknown_from"  # the (sub)parser that met the unknown arguments
# argparse's words: "invalid choice: 'x' (choose from 'a', 'b')" (3.12.8 and later: a, b)
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


# `--check-args` of the commands `atropos launch` starts (api serve, local serve, env serve,
# train): parse and validate the flags as a start would, then exit, starting nothing
CHECK_ARGS_HELP = (
    "check the flags and exit, starting nothing: 0 when they are good, 2 with the usage errors"
)


def usage_error(prog: str, message: str) -> NoReturn:
    """Print `PROG: error: MESSAGE (see: PROG --help)` to stderr and exit 2 (a usage error);
    a message of several lines (one per problem) gets `PROG: error: ` on each."""
    lines = message.splitlines() or [message]
    lines[-1] += f" (see: {prog} --help)"
    print("\n".join(f"{prog}: error: {line}" for line in lines), file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line with a "did you mean" where one is close.

    `--prot 8001` on a command with `--port` reads "unknown flag --prot; did you mean --port?",
    from the subcommand's own flags (`atropos api serve`), not the top level's. Subparsers made
    with `add_subparsers()` are Parsers too.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extra = super().parse_known_args(args, namespace)
        if extra and not hasattr(ns, _UNKNOWN_FROM):  # the innermost parser returns first
            setattr(ns, _UNKNOWN_FROM, self)
        return ns, extra

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        ns, extra = self.parse_known_args(args, namespace)
        owner = getattr(ns, _UNKNOWN_FROM, self)
        if hasattr(ns, _UNKNOWN_FROM):
            delattr(ns, _UNKNOWN_FROM)
        if extra:
            owner.error(owner.unknown_message(extra))
        return ns

    def unknown_message(self, extra: Sequence[str]) -> str:
        """What is wrong with arguments this parser does not know: the first flag, with the
        nearest of this parser's own flags, or the first stray word."""
        flag = next((a for a in extra if a.startswith("-") and a != "-"), None)
        if flag is None:
            return f"unexpected argument {extra[0]!r}"
        name = flag.split("=", 1)[0]
        known = [o for o in self._option_string_actions if o.startswith("--")]
        return f"unknown flag {name}{did_you_mean(name, known)}"

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            word = choice.group(1)
            listed = [c.strip().strip("'") for c in choice.group(2).split(",")]
            hint = did_you_mean(word, listed)
            message = f"{message[: choice.start()]}invalid choice {word!r}{hint}"
            message += f" (choose from {', '.join(listed)})"
        usage_error(self.prog, message)


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
