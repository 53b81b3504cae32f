"""The `swe_patch` environment: the fixture's tasks (each oracle fixes its file), reading and
applying SEARCH/REPLACE blocks, the similarity reward on hand-made edits, and runs against the
fake inference server."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import pytest

from atropos.environments import swe_patch
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.swe_patch import SwePatch
from atropos.environments.swe_patch.edits import (
    Edit,
    apply_edits,
    changes,
    judge_edits,
    read_edits,
    similarity,
)

from .helpers import (
    evaluate_against,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>The bug is in one line.</think>\n"
TASKS = read_jsonl(data_path("swe_patch", "train.jsonl")) + read_jsonl(
    data_path("swe_patch", "test.jsonl")
)
CODE = "def f(x):\n    y = x + 1\n    return y * 2\n"

# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, SwePatch)


def block(search: str, replace: str, path: str = "f.py") -> str:
    """A block of whole lines (a newline added where the text has none)."""
    search, replace = (t if t.endswith("\n") else t + "\n" for t in (search, replace))
    return f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def run_check(code: str, check: str) -> bool:
    """Whether the task's `check` passes on `code` (our own fixture code, run in-process)."""
    scope: dict = {}
    try:
        exec(code, scope)
        exec(check, scope)
    except Exception:
        return False
    return True


# ----- the fixture ----------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t["id"])
def test_each_oracle_applies_and_fixes_its_file(task):
    fixed = apply_edits(task["code"], read_edits(task["oracle"]) or [], task["path"])
    assert fixed is not None and fixed != task["code"]
    assert run_check(fixed, task["check"]) and not run_check(task["code"], task["check"])
    assert judge_edits(task["oracle"], task["code"], task["path"], fixed).score == 1.0


def test_the_fixture_splits():
    assert len(TASKS) >= 8 and len({t["id"] for t in TASKS}) == len(TASKS)
    assert [len(make().load()), len(make().load_eval())] == [6, 3]


# ----- reading and applying blocks ------------------------------------------------------------


def test_reading_blocks():
    text = "f.py\n```python\n<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x + 2\n"
    text += ">>>>>>> REPLACE\n```\nThen:\n<<<<<<< SEARCH\na\n=======\n>>>>>>> REPLACE"
    assert read_edits(text) == [
        Edit("f.py", "    y = x + 1\n", "    y = x + 2\n"),  # the fence is passed over
        Edit(None, "a\n", ""),  # "Then:" is no path
    ]
    named = read_edits("src/f.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE")
    assert named == [Edit("src/f.py", "a\n", "b\n")]
    assert read_edits("no edits here") == []
    assert read_edits("<<<<<<< SEARCH\na\n=======\nb\n") is None  # never closed
    assert read_edits("<<<<<<< SEARCH\na\n<<<<<<< SEARCH\n=======\n>>>>>>> REPLACE") is None


@pytest.mark.parametrize(
    ("edits", "result"),
    [
        ([Edit(None, "    y = x + 1\n", "    y = x + 2\n")], CODE.replace("+ 1", "+ 2")),
        ([Edit("f.py", "y = x + 1", "y = x - 1")], CODE.replace("+ 1", "- 1")),  # part of a line
        ([Edit("./f.py", "* 2", "* 3")], CODE.replace("* 2", "* 3")),
        ([Edit("pkg/f.py", "* 2", "* 3")], CODE.replace("* 2", "* 3")),
        (  # the second block sees the first one's result
            [Edit(None, "x + 1", "x + 10"), Edit(None, "x + 10\n", "x + 10\n    y += 1\n")],
            CODE.replace("x + 1\n", "x + 10\n    y += 1\n"),
        ),
        ([Edit("g.py", "* 2", "* 3")], None),  # another file
        ([Edit(None, "y", "z")], None),  # found three times
        ([Edit(None, "y = x+1", "y = x")], None),  # not there
        ([Edit(None, "  y = x + 1\n", "  y = x\n")], CODE.replace("  y = x + 1", "  y = x")),
        ([Edit(None, "\n", "")], None),  # blank: ambiguous
    ],
)
def test_applying_blocks(edits, result):
    assert apply_edits(CODE, edits, "f.py") == result


def test_similarity_compares_the_changes_of_the_results():
    oracle = CODE.replace("x + 1", "x + 2")
    assert similarity(CODE, oracle, oracle) == 1.0
    assert similarity(CODE, CODE, oracle) == 0.0  # no change
    close = similarity(CODE, CODE.replace("x + 1", "x + 3"), oracle)
    far = similarity(CODE, CODE.replace("return y * 2", "return 0"), oracle)
    assert 0.8 < close < 1.0 and far < close
    assert changes(CODE, oracle) == ["-    y = x + 1", "+    y = x + 2"]


@pytest.mark.parametrize(
    ("answer", "status", "score"),
    [
        (block("    y = x + 1\n", "    y = x + 2\n"), "exact", 1.0),
        (block("y = x + 1", "y = x + 2"), "exact", 1.0),  # another span, the same result
        (block("x + 1\n    return y * 2\n", "x + 2\n    return y * 2\n"), "exact", 1.0),
        (block("    y = x + 1\n", "    y = x + 3\n"), "applied", None),
        (block("    y = x + 1\n", "    y = x + 1\n"), "unchanged", 0.0),
        (block("    y = x + 7\n", "    y = x + 2\n"), "unappliable", 0.0),
        (block("* 2", "* 3", path="g.py"), "unappliable", 0.0),
        ("<<<<<<< SEARCH\n    y = x + 1\n=======\n", "malformed", 0.0),
        ("Just add one more.", "no_edits", 0.0),
        (None, "no_edits", 0.0),
    ],
)
def test_judging_hand_made_edits(answer, status, score):
    outcome = judge_edits(answer, CODE, "f.py", CODE.replace("x + 1", "x + 2"))
    assert outcome.status == status
    if score is None:
        assert 0.0 < outcome.score < 1.0
    else:
        assert outcome.score == score


# ----- the environment ------------------------------------------------------------------------


def item(**extra: object) -> dict:
    row = {"id": "t", "path": "f.py", "code": CODE, "issue": "y should be x + 2",
           "oracle": block("x + 1", "x + 2"), **extra}  # fmt: skip
    return make().check_row(row, "here")


def test_rows_are_checked_and_may_give_the_fixed_file():
    assert item()["fixed"] == CODE.replace("x + 1", "x + 2")
    fixed = CODE.replace("* 2", "* 4")
    assert item(oracle=None, fixed_code=fixed)["fixed"] == fixed
    with pytest.raises(ValueError, match="here: needs path, code, issue, and oracle"):
        item(oracle=None)
    with pytest.raises(ValueError, match="here: its oracle does not apply"):
        item(oracle=block("x + 9", "x + 2"))
    with pytest.raises(ValueError, match="here: its oracle does not apply"):
        item(oracle=None, fixed_code=CODE)


def test_the_prompt_shows_the_file_the_issue_and_the_form():
    env = make()
    messages = env.prompt(item())
    assert messages[0]["role"] == "system" and "<think>" in messages[0]["content"]
    text = messages[1]["content"]
    assert f"```python\n{CODE}```" in text and "y should be x + 2" in text
    assert "f.py\n<<<<<<< SEARCH\n" in text and ">>>>>>> REPLACE" in text
    assert make(thinking_mode=False).prompt(item())[0]["role"] == "user"


def test_scoring_and_metrics():
    env = make(ensure_scores_are_not_same=False)
    the_item = item()
    texts = [
        THINK + block("x + 1", "x + 2"),
        THINK + block("x + 1", "x + 3"),
        THINK + block("x + 9", "x + 2"),
        block("x + 1", "x + 2"),  # no think block
    ]
    scores = [env.score(the_item, t) for t in texts]
    assert scores[0] == 1.0 and 0 < scores[1] < 1 and scores[2:] == [0.0, 0.0]
    assert env.score_group(the_item, [rollout(text=t) for t in texts], scores) == scores
    asyncio.run(env.wandb_log())
    m = env.metrics
    assert (m["train/exact_rate"], m["train/applied_rate"]) == (0.25, 0.5)
    assert (m["errors/unappliable_rate"], m["errors/no_edit_rate"]) == (0.25, 0.25)
    assert m["train/similarity"] == pytest.approx(sum(scores) / 4)


def test_a_dataset_of_the_same_fields(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"path": "f.py", "code": CODE, "issue": f"issue {n}",
             "fixed_code": CODE.replace("* 2", f"* {n + 3}")} for n in range(10)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = make(dataset_name=str(path))
    assert len(env.load()) == 9 and len(env.load_eval()) == 1


# ----- against a fake inference server --------------------------------------------------------


def test_process_end_to_end(tmp_path):
    run = process_through_cli(SwePatch, swe_patch.demo_responder, tmp_path / "swe.jsonl")
    assert len(run.groups) == 3
    for g in run.groups:
        low, high = sorted(g["scores"])
        assert high == 1.0 and 0.0 < low < 0.5  # the oracle, and a comment on line one
    env_metrics = run.metrics["env"]
    assert (env_metrics["train/exact_rate"], env_metrics["train/applied_rate"]) == (0.5, 1.0)


def test_evaluate(tmp_path):
    run = evaluate_against(make, swe_patch.demo_responder, tmp_path)
    metrics = run.metrics
    assert metrics["eval/applied_rate"] == 1.0 and 0 < metrics["eval/exact_rate"] < 1
    assert {s["status"] for s in run.samples} == {"exact", "applied"}
    assert len(run.samples) == 3 and run.temperature == 0.0
