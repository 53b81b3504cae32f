"""`mcp_tools`' tasks and reward rules, as plain functions.

A task is one JSONL row: `prompt` (the user's request), then `answer` (a number, a string, or
a list of acceptable ones) or `checker` (`{"regex": PATTERN}`, `{"contains": [TEXT, ...]}`
or `{"python": "module:function"}`, called with the answer text and the row, returning a bool
or a score in [0, 1]), and optionally `tolerance` (absolute, for a numeric answer),
`expected_calls` (`[{"name", "arguments"}]`, the calls a good episode makes) and `id`.

The final answer is the text of the last `<answer>...</answer>` block of the policy's last
reply, or that reply's text after any `</think>` when it has none. A numeric gold matches
when the last number of the answer is within `tolerance` (default 1e-6) or 1e-4 relative of
it; a string gold matches when the normalised answer (lower case, spaces collapsed, quotes
and end punctuation dropped) equals it. The score is `(1 - w) * answer + w * calls`, where
`calls` is the share of the expected calls the episode made (matched one-to-one, extra
arguments allowed, "3" equal to 3) and `w` is `call_credit`; a task without expected calls
scores the answer alone.

>>> task = to_task({"prompt": "10 km in miles?", "answer": 6.21, "tolerance": 0.01,
...     "expected_calls": [{"name": "convert_units", "arguments": {"value": 10}}]}, "row 1")
>>> answer_score(task, extract_answer("<think>..</think>It is <answer>6.214 mi</answer>"))
1.0
>>> episode_score(task, "<answer>6.21</answer>", [], call_credit=0.2)
0.8
>>> normalise('  "New  York." ')
'new york'
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.common.tool_calls import count_matched
from atropos.envs.config import ConfigError

__all__ = [
    "Task",
    "answer_score",
    "call_share",
    "episode_score",
    "extract_answer",
    "final_score",
    "load_tasks",
    "normalise",
    "numbers_in",
    "to_task",
]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
_CHECKERS = ("regex", "contains", "python")
_DEFAULT_TOLERANCE = 1e-6
_RELATIVE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Task:
    """One task (the module docstring says what each field means)."""

    id: str
    prompt: str
    answer: Any = None
    checker: Mapping[str, Any] | None = None
    tolerance: float | None = None
    expected_calls: tuple[dict[str, Any], ...] = ()
    row: Mapping[str, Any] | None = None  # the whole row, for a python checker


def _check_checker(checker: Any, where: str) -> Mapping[str, Any]:
    kinds = "{'regex': ...}, {'contains': [...]} or {'python': 'module:function'}"
    if (
        not isinstance(checker, Mapping)
        or len(checker) != 1
        or next(iter(checker)) not in _CHECKERS
    ):
        raise ValueError(f"{where}: 'checker' must be one of {kinds}")
    kind, value = next(iter(checker.items()))
    if kind == "regex":
        try:
            re.compile(str(value))
        except re.error as err:
            raise ValueError(f"{where}: checker regex {value!r} does not compile: {err}") from None
    if kind == "contains" and not (isinstance(value, list) and value):
        raise ValueError(f"{where}: checker 'contains' must be a non-empty list of strings")
    if kind == "python":
        _python_checker(str(value), where)  # found now, not at the first score
    return checker


def _python_checker(target: str, where: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{where}: checker python {target!r} cannot be imported: {err}") from None
    if not callable(found):
        raise ValueError(f"{where}: checker python {target!r} is not a function")
    return found  # type: ignore[no-any-return]


def to_task(row: Mapping[str, Any], where: str) -> Task:
    """The task of a JSONL row; `where` names the row in errors.

    Raises:
        ValueError: no prompt, neither answer nor checker, a checker that cannot be used,
            `expected_calls` that are not `{"name", "arguments"}` objects.
    """
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    answer, checker = row.get("answer"), row.get("checker")
    if (answer is None) == (checker is None):
        raise ValueError(f"{where}: give exactly one of 'answer' and 'checker'")
    calls = row.get("expected_calls") or []
    if not isinstance(calls, list) or not all(
        isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in calls
    ):
        raise ValueError(f"{where}: 'expected_calls' must be a list of {{name, arguments}}")
    tolerance = row.get("tolerance")
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
    ):
        raise ValueError(f"{where}: 'tolerance' must be a number")  # fmt: skip
    return Task(
        id=str(row.get("id") or where),
        prompt=prompt,
        answer=answer,
        checker=_check_checker(checker, where) if checker is not None else None,
        tolerance=None if tolerance is None else float(tolerance),
        expected_calls=tuple(dict(c) for c in calls),
        row=dict(row),
    )


def load_tasks(split: str, dataset_name: str | None = None) -> list[Task]:
    """The tasks of `split` ("train" or "test"): the shipped `data/mcp_tools/<split>.jsonl`,
    or `dataset_name` (a JSONL file, a directory of `<split>.jsonl`, a hub dataset).

    Raises:
        ConfigError: a row that is not a task (named by file and line), or no tasks.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not dataset_name:
        source = str(data_path("mcp_tools", f"{split}.jsonl"))
    elif Path(dataset_name).is_dir():
        source = str(Path(dataset_name) / f"{split}.jsonl")
    else:
        source = f"{dataset_name} ({split})"
    try:
        rows = load_hub(dataset_name, split) if dataset_name else read_jsonl(source)
        tasks = [to_task(row, f"{source} row {n}") for n, row in enumerate(rows, 1)]
    except (ValueError, OSError) as err:  # a bad row or line, a missing file
        raise ConfigError(f"--env.dataset_name: {err}") from None
    if not tasks and split == "train":
        raise ConfigError(f"{source}: no tasks")
    return tasks


def extract_answer(reply: str) -> str:
    """The final answer in a reply: its last `<answer>` block, else its text after `</think>`.

    >>> extract_answer("<answer>1</answer> or <answer> 2 </answer>")
    '2'
    >>> extract_answer("<think>maybe 2</think> 3")
    '3'
    """
    blocks = _ANSWER.findall(reply)
    if blocks:
        return str(blocks[-1]).strip()
    return reply.rsplit("</think>", 1)[-1].strip()


def normalise(text: str) -> str:
    """Lower case, spaces collapsed, surrounding quotes and end punctuation dropped."""
    text = " ".join(str(text).lower().split())
    return text.strip(" \"'`").rstrip(".,;:!?").strip(" \"'`")


def numbers_in(text: str) -> list[float]:
    """The numbers written in `text`, in order (thousands commas read, `1e3` read).

    >>> numbers_in("from 1,250.5 to -3 and .5")
    [1250.5, -3.0, 0.5]
    """
    return [float(m.replace(",", "")) for m in _NUMBER.findall(text)]


def _matches_gold(gold: Any, answer: str, tolerance: float | None) -> bool:
    if isinstance(gold, list):
        return any(_matches_gold(g, answer, tolerance) for g in gold)
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        found = numbers_in(answer)
        return bool(found) and math.isclose(
            found[-1],
            float(gold),
            rel_tol=_RELATIVE_TOLERANCE,
            abs_tol=_DEFAULT_TOLERANCE if tolerance is None else tolerance,
        )
    return normalise(answer) == normalise(str(gold))


def answer_score(task: Task, answer: str) -> float:
    """1.0 when `answer` matches the task's gold (or its checker says so), else 0.0; a python
    checker may return a score in [0, 1] (clipped)."""
    checker = task.checker
    if checker is None:
        return 1.0 if _matches_gold(task.answer, answer, task.tolerance) else 0.0
    kind, value = next(iter(checker.items()))
    if kind == "regex":
        return 1.0 if re.fullmatch(str(value), answer.strip(), re.IGNORECASE) else 0.0
    if kind == "contains":
        low = answer.lower()
        return 1.0 if all(str(v).lower() in low for v in value) else 0.0
    got = _python_checker(str(value), task.id)(answer, task.row)
    return min(1.0, max(0.0, float(got)))


def call_share(task: Task, calls: Sequence[Mapping[str, Any]]) -> float:
    """The share of the task's expected calls that `calls` made (one-to-one, any order; extra
    arguments allowed, numbers and the strings spelling them equal); 1.0 with none expected."""
    if not task.expected_calls:
        return 1.0
    return count_matched(task.expected_calls, calls, lenient=True) / len(task.expected_calls)


def final_score(task: Task, final_reply: str | None) -> float:
    """`answer_score` of the answer in `final_reply`; 0.0 without one (turns or tokens ran
    out)."""
    return 0.0 if final_reply is None else answer_score(task, extract_answer(final_reply))


def episode_score(
    task: Task, final_reply: str | None, calls: Sequence[Mapping[str, Any]], call_credit: float
) -> float:
    """An episode's score (module docstring); no final reply is a wrong answer."""
    answer = final_score(task, final_reply)
    if not task.expected_calls or call_credit <= 0:
        return answer
    return round((1 - call_credit) * answer + call_credit * call_share(task, calls), 6)
