"""The world of `mt_grpo`: a made-up atlas, its two tools, and the tasks asked about it.

The atlas (`data/mt_grpo/world.json`: capitals, populations, areas, founding years, currencies
and their worth in gold) is invented, so the policy has to look its facts up. Two tools run
here, deterministically, on the policy's own calls (a wrong call gets a wrong value or an
error back, and the episode goes on from there):

- `lookup(table, key)`: one entry of one table (names compared without case);
- `calculator(expression)`: exact arithmetic (fractions) on numbers, `+ - * /` and parentheses.

A task is a question, the calls that answer it in order, and the answer (shipped in
`data/mt_grpo/{train,test}.jsonl`; the same files under `--env.data_dir` replace them).

>>> world = load_world()
>>> world.run({"name": "lookup", "arguments": {"table": "capital", "key": "avaria"}})
{'tool': 'lookup', 'result': 'Brelholm'}
>>> world.run({"name": "calculator", "arguments": {"expression": "482000 / 241"}})
{'tool': 'calculator', 'result': 2000}
>>> same_answer("2,000", "2000"), same_answer("brelholm", "Brelholm"), same_answer("2", "2.5")
(True, True, False)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.common.expressions import exact_value

__all__ = [
    "TOOLS",
    "Task",
    "World",
    "calculate",
    "load_tasks",
    "load_world",
    "number_text",
    "same_answer",
]

TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "lookup",
        "description": "One entry of a table of the atlas, e.g. table 'capital', key 'Avaria'.",
        "parameters": {
            "type": "object",
            "properties": {
                "table": {"type": "string", "description": "the table's name"},
                "key": {"type": "string", "description": "a country, city or currency"},
            },
            "required": ["table", "key"],
        },
    },
    {
        "name": "calculator",
        "description": "Exact arithmetic: numbers, + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. '3 * (4 + 5)'"}},
            "required": ["expression"],
        },
    },
)


def calculate(expression: str) -> Fraction:
    """The exact value of `expression`: numbers (decimals too, thousands commas dropped),
    `+ - * /`, unary minus and parentheses (`common.expressions.exact_value`).

    Raises:
        ExpressionError: (a ValueError) anything else, or a division by zero.
    """
    return exact_value(expression.replace(",", ""), operators="+-*/")


def number_text(value: Fraction) -> str:
    """A value as the tools and answers write it: an integer, or a decimal of up to 6 places.

    >>> number_text(Fraction(7, 2)), number_text(Fraction(4)), number_text(Fraction(1, 3))
    ('3.5', '4', '0.333333')
    """
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", "").replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def same_answer(given: str, expected: str) -> bool:
    """Whether an answer says the expected one: numbers by value (thousands commas allowed,
    within 1e-6), anything else as the same words in any case."""
    got, want = _as_number(given), _as_number(expected)
    if got is not None and want is not None:
        return abs(got - want) <= Fraction(1, 10**6)
    return " ".join(given.split()).casefold() == " ".join(expected.split()).casefold()


def _argument(args: Any, key: str) -> Any:
    """`args[key]`; ValueError when `args` is not an object or lacks it."""
    if not isinstance(args, Mapping):
        raise ValueError("arguments must be an object")
    if key not in args:
        raise ValueError(f"missing argument {key!r}")
    return args[key]


def _plain(value: Any) -> Any:
    """A table value or a calculation as JSON: an int where it is whole."""
    if isinstance(value, (Fraction, float)) and Fraction(value).denominator == 1:
        return int(value)
    if isinstance(value, Fraction):
        return float(number_text(value))
    return value


@dataclass(frozen=True)
class World:
    """The atlas: table name -> key -> value."""

    tables: Mapping[str, Mapping[str, Any]]

    def lookup(self, table: str, key: str) -> Any:
        """One entry (names compared without case); ValueError names what exists."""
        tables = {name.casefold(): name for name in self.tables}
        name = tables.get(str(table).strip().casefold())
        if name is None:
            raise ValueError(f"no table {table!r}; tables: {', '.join(self.tables)}")
        entries = {k.casefold(): k for k in self.tables[name]}
        found = entries.get(str(key).strip().casefold())
        if found is None:
            raise ValueError(f"no {key!r} in {name}; keys: {', '.join(self.tables[name])}")
        return self.tables[name][found]

    def run(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """Run one parsed call: `{"tool", "result"}`, or `{"tool", "error"}` when it fails."""
        name, args = call.get("name"), call.get("arguments")
        try:
            if name == "lookup":
                value = self.lookup(_argument(args, "table"), _argument(args, "key"))
            elif name == "calculator":
                value = calculate(str(_argument(args, "expression")))
            else:
                raise ValueError(f"no tool {name!r}; tools: lookup, calculator")
        except ValueError as err:
            return {"tool": name, "error": str(err)}
        return {"tool": name, "result": _plain(value)}

    def same_arguments(self, name: str, expected: Mapping[str, Any], given: Any) -> bool:
        """Whether `given` asks what `expected` asks: a lookup the same table and key (any
        case), a calculation an expression of the same value."""
        if not isinstance(given, Mapping):
            return False
        if name == "calculator":
            try:
                want = calculate(str(expected["expression"]))
                return bool(calculate(str(given.get("expression", ""))) == want)
            except ValueError:
                return False
        return all(
            str(given.get(k, "")).strip().casefold() == str(v).strip().casefold()
            for k, v in expected.items()
        )


@dataclass(frozen=True)
class Task:
    """One question: its id, text, the calls that answer it (in order) and the answer."""

    id: str
    question: str
    calls: tuple[dict[str, Any], ...]
    answer: str


def load_world(data_dir: str | Path | None = None) -> World:
    """The atlas in `data_dir/world.json` (default: the shipped one)."""
    path = Path(data_dir) / "world.json" if data_dir else data_path("mt_grpo", "world.json")
    with open(path, encoding="utf-8") as f:
        tables = json.load(f)
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise ValueError(f"{path}: expected an object of tables, each an object of entries")
    return World(tables)


def _is_call(call: Any) -> bool:
    return (
        isinstance(call, dict)
        and call.get("name") in ("lookup", "calculator")
        and isinstance(call.get("arguments"), dict)
    )


def _task(row: Mapping[str, Any], where: str) -> Task:
    calls = row.get("calls")
    if (
        not isinstance(row.get("question"), str)
        or not isinstance(calls, list)
        or not calls
        or not all(_is_call(c) for c in calls)
        or "answer" not in row
    ):
        raise ValueError(
            f"{where}: a task needs 'question' (text), 'calls' (a non-empty list of"
            " {name: lookup|calculator, arguments: {...}}) and 'answer'"
        )
    return Task(str(row.get("id") or where), row["question"], tuple(calls), str(row["answer"]))


def load_tasks(split: str, data_dir: str | Path | None = None) -> list[Task]:
    """The tasks of `split` ("train" or "test") from `data_dir` (default: the shipped ones)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    path = Path(data_dir) / f"{split}.jsonl" if data_dir else data_path("mt_grpo", f"{split}.jsonl")
    return [_task(row, f"{path} line {n}") for n, row in enumerate(read_jsonl(path), 1)]
