"""Coding problems (MBPP and HumanEval style), and judging a solution in the sandbox.

An item is a dict: `task_id`, `prompt` (the statement), `starter` (code shown to complete, may
be empty), `preamble` (code put before the solution when testing, e.g. HumanEval's imports),
`setup` (code run before the tests), `tests` (assert snippets run after the solution, in
order), `io` (`{"input", "output"}` stdin/stdout cases; a problem has tests or io cases),
`entry_point` and `solution` (a reference, for tests and demos only; never shown).

>>> extract_code("Sure:\\n```python\\nprint(1)\\n```\\nand better:\\n```py\\nprint(2)\\n```")
'print(2)\\n'
>>> extract_code("no code here") is None
True
>>> row = {"task_id": 2, "text": "Add two numbers.", "code": "def add(a, b): return a + b",
...        "test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""}
>>> item = from_mbpp(row)
>>> item["task_id"], item["entry_point"], item["tests"]
('mbpp/2', 'add', ['assert add(1, 2) == 3'])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atropos.environments.code_execution.sandbox import CodeRunner, RunResult
from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl

__all__ = [
    "HUMANEVAL_NAMES",
    "MBPP_NAMES",
    "Job",
    "Verdict",
    "acheck_solution",
    "check_solution",
    "extract_code",
    "from_humaneval",
    "from_mbpp",
    "jobs_for",
    "judge",
    "load_problems",
    "to_item",
]

MBPP_NAMES = ("mbpp", "google-research-datasets/mbpp", "Muennighoff/mbpp")
HUMANEVAL_NAMES = ("openai_humaneval", "openai/openai_humaneval")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON = {"", "python", "py", "python3", "py3"}
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_DEF = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def extract_code(completion: str) -> str | None:
    """The last fenced Python code block (```python, ```py or a bare ```) of the answer after
    the last `</think>`; None when there is none (an unclosed block does not count)."""
    text = completion.rsplit("</think>", 1)[-1]
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in _PYTHON]
    code = blocks[-1] if blocks else None
    return code if code and code.strip() else None


def to_item(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An item from a row in our format, checked; `where` names the row in errors."""

    def text(key: str, default: str | None = None) -> str:
        value = row.get(key, default)
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
        return value

    tests = row.get("tests") or []
    io = row.get("io") or []
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"{where}: 'tests' must be a list of strings")
    if not isinstance(io, list) or not all(
        isinstance(c, Mapping)
        and isinstance(c.get("input"), str)
        and isinstance(c.get("output"), str)
        for c in io
    ):
        raise ValueError(f"{where}: 'io' must be a list of {{'input': str, 'output': str}}")
    if not tests and not io:
        raise ValueError(f"{where}: a problem needs 'tests' or 'io' cases")
    entry = row.get("entry_point")
    return {
        "task_id": str(row.get("task_id", where)),
        "prompt": text("prompt"),
        "starter": text("starter", ""),
        "preamble": text("preamble", ""),
        "setup": text("setup", ""),
        "tests": list(tests),
        "io": [{"input": c["input"], "output": c["output"]} for c in io],
        "entry_point": entry if isinstance(entry, str) else None,
        "solution": text("solution", ""),
    }


def from_mbpp(row: Mapping[str, Any]) -> dict[str, Any]:
    """An item from an MBPP row (`full`: text, code, test_list, test_setup_code; `sanitized`:
    prompt, code, test_list, test_imports). The prompt shows the tests, as in the paper."""
    statement = str(row.get("text") or row.get("prompt") or "").strip()
    tests = [str(t) for t in row["test_list"]]
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
    names = _DEF.findall(str(row.get("code", "")))
    called = [m for t in tests for m in _CALL.findall(t.replace("assert", " ", 1))]
    entry = next((n for n in called if n in names), names[-1] if names else None)
    shown = "\n".join(tests)
    return to_item(
        {
            "task_id": f"mbpp/{row['task_id']}",
            "prompt": f"{statement}\nYour code should pass these tests:\n\n{shown}",
            "setup": str(setup),
            "tests": tests,
            "entry_point": entry,
            "solution": str(row.get("code", "")),
        },
        f"mbpp row {row.get('task_id')}",
    )


def from_humaneval(row: Mapping[str, Any]) -> dict[str, Any]:
    """An item from a HumanEval row (prompt, canonical_solution, test, entry_point): complete
    the function; the prompt's code before the function (imports, helpers) is the preamble."""
    code, entry = str(row["prompt"]), str(row["entry_point"])
    starts = [m.start() for m in re.finditer(rf"^def\s+{re.escape(entry)}\s*\(", code, re.M)]
    preamble = code[: starts[-1]].rstrip() if starts else ""
    return to_item(
        {
            "task_id": str(row["task_id"]),
            "prompt": f"Complete the Python function `{entry}` as its docstring describes.",
            "starter": code,
            "preamble": preamble,
            "tests": [f"{row['test']}\n\ncheck({entry})"],
            "entry_point": entry,
            "solution": code + str(row.get("canonical_solution", "")),
        },
        f"humaneval row {row.get('task_id')}",
    )


def load_problems(
    split: str, dataset_name: str | None = None, dataset_config: str | None = None
) -> list[dict[str, Any]]:
    """The items of `split`: the shipped fixture (`train`, `test`), or a hub dataset by name.

    MBPP (`mbpp`, `google-research-datasets/mbpp`) has train, validation, test and prompt splits
    (config `full` by default, or `sanitized`); HumanEval (`openai_humaneval`) has only `test`,
    which is used whatever split is asked for.
    """
    if not dataset_name:
        if split not in ("train", "test"):
            raise ValueError(f"the fixture has splits 'train' and 'test', got {split!r}")
        path = data_path("code_execution", f"{split}.jsonl")
        return [to_item(r, f"{path} row {n}") for n, r in enumerate(read_jsonl(path), 1)]
    if dataset_name in MBPP_NAMES:
        return [from_mbpp(r) for r in load_hub(dataset_name, split, dataset_config or "full")]
    if dataset_name in HUMANEVAL_NAMES:
        return [from_humaneval(r) for r in load_hub(dataset_name, "test", dataset_config)]
    known = ", ".join(MBPP_NAMES + HUMANEVAL_NAMES)
    raise ValueError(f"no loader for the dataset {dataset_name!r}; known: {known}")


@dataclass(frozen=True)
class Job:
    """One sandbox run of a check: the program, its stdin, and what must come out (the output
    of a stdin/stdout case, or the tests' verdict)."""

    program: str
    stdin: str = ""
    expected_output: str | None = None  # stdin/stdout cases
    tests: str | None = None  # assert problems: run against `program`'s names, apart from it


@dataclass(frozen=True)
class Verdict:
    """Whether a solution passed, and if not, why (`status`: the sandbox's, or `wrong_output`,
    `no_code`, `exited_early`)."""

    passed: bool
    status: str
    detail: str = ""


def jobs_for(item: Mapping[str, Any], code: str) -> list[Job]:
    """The runs that check `code` against `item`: one per stdin/stdout case, or one run of the
    preamble and the code, judged by the preamble, the setup and every assert in another
    process (`CodeRunner.run` with `tests`), whose verdict the code cannot forge."""
    if item.get("io"):
        return [Job(code, case["input"], case["output"]) for case in item["io"]]
    preamble = item.get("preamble", "")
    program = "\n\n".join(p for p in (preamble, code) if p) + "\n"
    restore = _restore_builtins(item.get("entry_point"))
    parts = (restore, preamble, item.get("setup", ""), *item["tests"])
    tests = "\n\n".join(p for p in parts if p)
    return [Job(program, tests=tests + "\n")]


def _restore_builtins(entry_point: str | None) -> str:
    """Judge-side code giving back the built-ins the code under test shadowed (`def abs(x):
    return 0` would pass `abs(f(x) - y) < 1e-6`), all but the function under test; nothing
    when the item does not name it."""
    if not entry_point:
        return ""
    return (
        "import builtins as _b\n"
        f"globals().update({{n: getattr(_b, n) for n in dir(_b) if n in globals()"
        f" and n != {entry_point!r} and not n.startswith('__')}})\n"
        "del _b"
    )


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def judge(job: Job, result: RunResult) -> Verdict:
    """The verdict of one run."""
    if job.tests is not None and result.tests == "exited_early" and result.status != "timeout":
        return Verdict(False, "exited_early", "the code under test ended before the tests did")
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
        return Verdict(False, result.status, tail[0][:300])
    if job.tests is not None:
        if result.tests != "passed":
            return Verdict(False, "exited_early", "the tests did not run to the end")
        return Verdict(True, "ok")
    if job.expected_output is not None and _lines(result.stdout) != _lines(job.expected_output):
        return Verdict(False, "wrong_output", result.stdout[-300:])
    return Verdict(True, "ok")


def check_solution(sandbox: CodeRunner, item: Mapping[str, Any], completion: str) -> Verdict:
    """Extract the code from `completion` and run `item`'s tests on it (stops at a failure).
    A sandbox that fails (`SandboxError`) is raised, never a verdict."""
    code = extract_code(completion)
    if code is None:
        return Verdict(False, "no_code", "no fenced Python code block")
    verdict = Verdict(False, "no_tests")
    for job in jobs_for(item, code):
        verdict = judge(job, sandbox.run(job.program, job.stdin, job.tests))
        if not verdict.passed:
            break
    return verdict


async def acheck_solution(sandbox: CodeRunner, item: Mapping[str, Any], completion: str) -> Verdict:
    """`check_solution` without blocking the event loop."""
    code = extract_code(completion)
    if code is None:
        return Verdict(False, "no_code", "no fenced Python code block")
    verdict = Verdict(False, "no_tests")
    for job in jobs_for(item, code):
        verdict = judge(job, await sandbox.arun(job.program, job.stdin, job.tests))
        if not verdict.passed:
            break
    return verdict
