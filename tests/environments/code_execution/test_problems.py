"""Coding problems: extracting code, the item format, MBPP and HumanEval rows, the fixture,
and judging solutions in the sandbox."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from atropos.environments.code_execution.problems import (
    acheck_solution,
    check_solution,
    extract_code,
    from_humaneval,
    from_mbpp,
    jobs_for,
    load_problems,
    to_item,
)
from atropos.environments.code_execution.sandbox import CodeRunner
from atropos.environments.common.data_loading import HubUnavailable


@pytest.fixture(scope="module")
def box():
    return CodeRunner(timeout=3, cpu_seconds=2, max_concurrency=2)


ADD = {
    "task_id": "t/add",
    "prompt": "Add.",
    "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
}
ECHO = {"task_id": "t/echo", "prompt": "Echo.", "io": [{"input": "a b\n", "output": "b a\n"}]}


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go.\n```{lang}\n{code}\n```\n"


# ----- extracting code -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        (fenced("x = 1"), "x = 1\n"),
        (fenced("x = 1", "py") + fenced("x = 2", ""), "x = 2\n"),  # the last block wins
        (fenced("x = 1") + fenced("ls -l", "bash"), "x = 1\n"),  # other languages are skipped
        ("<think>```python\nx = 1\n```</think>no code after thinking", None),
        ("<think>draft</think>" + fenced("x = 3"), "x = 3\n"),
        ("```python\nx = 1\n", None),  # never closed (a truncated answer)
        ("x = 1", None),
        (fenced("   "), None),
    ],
)
def test_extract_code_takes_the_last_python_block(completion, code):
    assert extract_code(completion) == code


# ----- items -------------------------------------------------------------------------------------


def test_rows_become_items_and_bad_rows_are_named():
    item = to_item(ADD, "r1")
    assert item["tests"] == ADD["tests"] and item["io"] == [] and item["starter"] == ""
    assert to_item(ECHO, "r2")["io"] == ECHO["io"]
    with pytest.raises(ValueError, match="r3: a problem needs 'tests' or 'io'"):
        to_item({"prompt": "x"}, "r3")
    with pytest.raises(ValueError, match="r4: 'prompt' must be a string"):
        to_item({"tests": ["assert 1"]}, "r4")
    with pytest.raises(ValueError, match="r5: 'io' must be a list"):
        to_item({"prompt": "x", "io": [{"input": 1}]}, "r5")
    with pytest.raises(ValueError, match="r6: 'tests' must be a list of strings"):
        to_item({"prompt": "x", "tests": "assert 1"}, "r6")


MBPP_FULL = {
    "task_id": 11,
    "text": "Write a python function to remove first and last occurrence of a given character.",
    "code": "def helper(s):\n    return s\ndef remove_Occ(s, ch):\n    return s.replace(ch, '')",
    "test_list": [
        'assert remove_Occ("hello","l") == "heo"',
        'assert remove_Occ("abcda","a") == "bcd"',
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}
MBPP_SANITIZED = {
    "task_id": 12,
    "prompt": "Write a function to sort a matrix by its row sums.",
    "code": "import math\ndef sort_matrix(m):\n    return sorted(m, key=sum)",
    "test_list": ["assert sort_matrix([[2], [1]]) == [[1], [2]]"],
    "test_imports": ["import math"],
}
HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": (
        "from typing import List\n\n\ndef helper(x):\n    return x\n\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        '    """ Check if any two numbers are closer than threshold. """\n'
    ),
    "canonical_solution": (
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
        " for b in numbers[i + 1:])\n"
    ),
    "test": (
        "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) == True\n"
        "    assert candidate([1.0, 2.0], 0.5) == False\n"
    ),
    "entry_point": "has_close_elements",
}


def test_mbpp_rows_of_both_configs_map_to_items():
    full = from_mbpp(MBPP_FULL)
    assert full["task_id"] == "mbpp/11" and full["entry_point"] == "remove_Occ"
    assert (
        full["prompt"].startswith(MBPP_FULL["text"]) and MBPP_FULL["test_list"][1] in full["prompt"]
    )
    assert full["tests"] == MBPP_FULL["test_list"] and full["solution"] == MBPP_FULL["code"]
    sanitized = from_mbpp(MBPP_SANITIZED)
    assert sanitized["setup"] == "import math" and sanitized["entry_point"] == "sort_matrix"


def test_humaneval_rows_map_to_items_with_the_prompt_as_starter():
    item = from_humaneval(HUMANEVAL)
    assert item["task_id"] == "HumanEval/0" and item["starter"] == HUMANEVAL["prompt"]
    assert (
        item["preamble"].startswith("from typing import List") and "def helper" in item["preamble"]
    )
    assert "has_close_elements(" not in item["preamble"]
    assert item["tests"] == [HUMANEVAL["test"] + "\n\ncheck(has_close_elements)"]


def test_reference_solutions_of_mapped_rows_pass(box):
    for item in (from_mbpp(MBPP_FULL), from_mbpp(MBPP_SANITIZED), from_humaneval(HUMANEVAL)):
        assert check_solution(box, item, fenced(item["solution"])).passed, item["task_id"]
    # a HumanEval answer that leaves out the prompt's imports still runs: the preamble has them
    body = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    body += HUMANEVAL["canonical_solution"]
    assert check_solution(box, from_humaneval(HUMANEVAL), fenced(body)).passed


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []
    rows = {"mbpp": [MBPP_FULL], "google-research-datasets/mbpp": [MBPP_FULL]}
    rows["openai_humaneval"] = [HUMANEVAL]

    def load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        if name not in rows:
            raise FileNotFoundError(name)
        return list(rows[name])

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_hub_datasets_load_by_name(fake_datasets):
    [mbpp] = load_problems("train", "google-research-datasets/mbpp")
    [sanitized] = load_problems("test", "mbpp", "sanitized")
    [humaneval] = load_problems("train", "openai_humaneval")  # only a test split exists
    assert mbpp["task_id"] == sanitized["task_id"] == "mbpp/11"
    assert humaneval["task_id"] == "HumanEval/0"
    assert fake_datasets == [
        ("google-research-datasets/mbpp", "full", "train"),
        ("mbpp", "sanitized", "test"),
        ("openai_humaneval", None, "test"),
    ]
    with pytest.raises(ValueError, match="no loader for the dataset 'other/code'"):
        load_problems("train", "other/code")
    with pytest.raises(HubUnavailable, match="openai/openai_humaneval"):
        load_problems("train", "openai/openai_humaneval")  # a known name the hub refuses


# ----- the fixture -------------------------------------------------------------------------------


def test_the_fixture_has_both_styles_and_disjoint_splits():
    train, test = load_problems("train"), load_problems("test")
    assert (len(train), len(test)) == (22, 8)
    assert not {i["task_id"] for i in train} & {i["task_id"] for i in test}
    for items in (train, test):
        assert sum(bool(i["io"]) for i in items) == 2  # stdin/stdout problems
        assert sum(bool(i["starter"]) for i in items) >= 2  # HumanEval style
        assert all(i["solution"] and (i["tests"] or i["io"]) for i in items)
    with pytest.raises(ValueError, match="splits 'train' and 'test'"):
        load_problems("validation")


def test_every_fixture_reference_passes(box):
    items = load_problems("train") + load_problems("test")

    async def main() -> list:
        return await asyncio.gather(
            *(acheck_solution(box, i, fenced(i["solution"])) for i in items)
        )

    verdicts = asyncio.run(main())
    assert [v.passed for v in verdicts] == [True] * len(items), [
        v for v in verdicts if not v.passed
    ]


# ----- judging -----------------------------------------------------------------------------------


def test_correct_wrong_syntax_error_and_no_code(box):
    assert check_solution(box, ADD, fenced("def add(a, b):\n    return a + b")).passed
    wrong = check_solution(box, ADD, fenced("def add(a, b):\n    return a - b"))
    assert (wrong.passed, wrong.status, wrong.detail) == (False, "error", "AssertionError")
    syntax = check_solution(box, ADD, fenced("def add(a, b)\n    return a + b"))
    assert not syntax.passed and "SyntaxError" in syntax.detail
    none = check_solution(box, ADD, "def add(a, b): return a + b")
    assert (none.passed, none.status) == (False, "no_code")


def test_stdin_stdout_cases_compare_lines(box):
    right = "a, b = input().split()\nprint(b, a)   "
    assert check_solution(box, ECHO, fenced(right)).passed
    verdict = check_solution(box, ECHO, fenced("print(input())"))
    assert (verdict.passed, verdict.status) == (False, "wrong_output")


@pytest.mark.parametrize("cheat", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()"])
def test_exiting_before_the_tests_is_not_a_pass(box, cheat):
    verdict = check_solution(box, ADD, fenced(f"def add(a, b):\n    return 0\n{cheat}"))
    assert (verdict.passed, verdict.status) == (False, "exited_early")


def test_the_tests_are_not_in_the_program_under_test():
    [job] = jobs_for(ADD, "pass")
    assert job.program == "pass\n" and all(t in job.tests for t in ADD["tests"])
    assert [j.stdin for j in jobs_for(ECHO, "pass")] == ["a b\n"]
