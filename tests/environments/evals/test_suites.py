"""The table of suites: every suite is registered, evaluation only, and ships a fixture in its
dataset's row layout whose gold answers grade right; parts are chosen with `--env.subsets`; the
real data is read from the hub part by part (through a fake `datasets`), from a mirror, a local
directory or a local file."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.evals import (
    ENVS,
    SUITES,
    AGIEvalEval,
    ARCEval,
    ArenaHardEval,
    BBHEval,
    EvaluationOnly,
    MuSREval,
    SuiteEval,
)
from atropos.environments.evals.suite import Part
from atropos.envs import registry

from .helpers import GRADED, answer, fake_hub, make

LAYOUTS = {  # the fields each dataset's rows have, as its hub card lists them
    "eval_arc": {"id", "question", "choices", "answerKey"},
    "eval_boolq": {"question", "passage", "answer"},
    "eval_hellaswag": {"ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "label"},
    "eval_piqa": {"goal", "sol1", "sol2", "label"},
    "eval_siqa": {"context", "question", "answerA", "answerB", "answerC", "label"},
    "eval_winogrande": {"sentence", "option1", "option2", "answer"},
    "eval_openbookqa": {"id", "question_stem", "choices", "answerKey"},
    "eval_mmlu_pro": {"question_id", "question", "options", "answer", "answer_index", "category"},
    "eval_bbh": {"input", "target"},
    "eval_drop": {"section_id", "query_id", "passage", "question", "answer", "validated_answers"},
    "eval_agieval": {"query", "choices", "gold"},
    "eval_musr": {"narrative", "question", "choices", "answer_index", "answer_choice"},
    "eval_pubmedqa": {"pubid", "question", "context", "long_answer", "final_decision"},
    "eval_olympiadbench": {"id", "question", "final_answer", "is_multiple_answer", "unit"},
    "eval_simpleqa": {"metadata", "problem", "answer"},
    "eval_mt_bench": {"question_id", "category", "turns", "reference"},
    "eval_arena_hard": {"uid", "category", "cluster", "prompt"},
}


def fixture_rows(part: Part) -> list[dict[str, Any]]:
    return read_jsonl(data_path("evals", part.fixture)) if part.fixture else []


# ----- the table ---------------------------------------------------------------------------------


def test_the_table_names_every_suite_once():
    assert [s.name for s in SUITES] == list(ENVS)
    assert len({s.benchmark for s in SUITES}) == len(SUITES) == 21
    assert set(LAYOUTS) <= set(ENVS)
    for suite in SUITES:
        assert len({p.label for p in suite.parts}) == len(suite.parts), suite.name
        assert any(p.default and p.fixture for p in suite.parts), suite.name


@pytest.mark.parametrize("name", sorted(ENVS))
def test_each_suite_is_registered_and_evaluation_only(name):
    cls = ENVS[name]
    assert registry.get(name) is cls, "run `pip install -e .` to install entry points"
    assert registry.specs()[name].origin == registry.BUILT_IN
    assert (cls.name, cls.__name__, cls.__doc__) == (name, cls.__qualname__, cls.suite.title)
    assert cls.evaluation_only and issubclass(cls, SuiteEval)
    env = make(cls)
    asyncio.run(env.setup())
    assert env.problems
    with pytest.raises(EvaluationOnly, match=f"atropos env evaluate {name}"):
        asyncio.run(env.get_next_item())


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_fixture_is_in_its_datasets_row_layout(name):
    parts = [p for p in ENVS[name].suite.parts if p.fixture]
    for part in parts:
        rows = fixture_rows(part)
        assert rows, part.fixture
        for row in rows:
            assert LAYOUTS[name] <= set(row), (part.fixture, sorted(row))
    ids = [p.id for p in make(ENVS[name]).load_problems()]
    assert len(ids) == len(set(ids)), "problem ids must be unique"


@pytest.mark.parametrize("name", GRADED)
def test_every_fixture_gold_grades_right_and_a_wrong_answer_wrong(name):
    env = make(ENVS[name])
    for problem in env.load_problems():
        right = env.grade_completion(problem, f"<think>Working.</think>{answer(env, problem)}")
        assert right.correct, (problem.id, right)
        wrong = env.grade_completion(problem, answer(env, problem, right=False))
        assert not wrong.correct, (problem.id, wrong)


# ----- parts -------------------------------------------------------------------------------------


def test_subsets_choose_parts_and_name_their_accuracy():
    everything = make(ARCEval).load_problems()
    assert [p.subsets["subset"] for p in everything] == ["ARC-Easy"] * 4 + ["ARC-Challenge"] * 3
    hard = make(ARCEval, subsets=["ARC-Challenge"]).load_problems()
    assert hard == everything[4:]
    with pytest.raises(ValueError, match="no part 'ARC-Chalenge'; did you mean 'ARC-Challenge'"):
        make(ARCEval, subsets=["ARC-Chalenge"]).load_problems()


def test_default_parts_and_parts_without_fixture_rows():
    agieval = make(AGIEvalEval).load_problems()
    assert {p.subsets["subset"] for p in agieval} == {
        "aqua-rat",
        "logiqa-en",
        "lsat-ar",
        "sat-math",
    }
    with pytest.raises(ValueError, match=r"no rows of gaokao-physics.*dmayhem93/agieval"):
        make(AGIEvalEval, subsets=["gaokao-physics"]).load_problems()
    tasks = {p.subsets["task"] for p in make(BBHEval).load_problems()}
    assert len(tasks) == 7 and len(BBHEval.suite.parts) == 27


def test_subsets_flag_takes_comma_text():
    config = ARCEval.env_config_cls.model_validate({"subsets": "ARC-Easy, ARC-Challenge"})
    assert config.subsets == ["ARC-Easy", "ARC-Challenge"]  # type: ignore[attr-defined]


# ----- the hub -----------------------------------------------------------------------------------


def rows_from_fixtures(suite_parts: tuple[Part, ...]):
    """A stand-in hub serving each part's fixture rows under its dataset, config and split."""

    def rows_of(name: str, config: str | None, split: str) -> list[dict[str, Any]]:
        found = [p for p in suite_parts if (p.dataset, p.config, p.split) == (name, config, split)]
        return [dict(row) for part in found for row in fixture_rows(part)]

    return rows_of


@pytest.mark.parametrize("name", sorted(set(ENVS) - {"eval_arena_hard"}))
def test_each_default_part_is_read_from_the_hub_with_its_config_and_split(monkeypatch, name):
    cls = ENVS[name]
    calls = fake_hub(monkeypatch, rows_from_fixtures(cls.suite.parts))
    from_hub = make(cls, dataset_name=cls.suite.hub_dataset).load_problems()
    parts = [p for p in cls.suite.parts if p.default]
    assert calls == [(p.dataset, p.config, p.split) for p in parts]
    assert from_hub == make(cls).load_problems()  # the same rows give the same problems


def test_arena_hard_reads_prompts_and_baselines_from_the_hub(monkeypatch):
    def rows_of(name, config, split):
        if name == ArenaHardEval.baseline_hub:
            return read_jsonl(data_path("evals", "arena_hard/baselines.jsonl"))
        return read_jsonl(data_path("evals", "arena_hard/prompts.jsonl"))

    calls = fake_hub(monkeypatch, rows_of)
    found = make(ArenaHardEval, dataset_name="NousResearch/arena-hard-v1-prompts").load_problems()
    assert calls == [
        ("NousResearch/arena-hard-v1-prompts", None, "train"),
        ("NousResearch/gpt-4-0314-baseline-arenahard", None, "train"),
    ]
    assert found == make(ArenaHardEval).load_problems()
    assert found[2].gold.startswith("SELECT customer_id")
    mine = make(ArenaHardEval, baseline_dataset="me/baselines", baseline_split="test")
    fake_hub(monkeypatch, lambda *_: [{"uid": "fx-arena-1", "answer": "x"}])
    with pytest.raises(ValueError, match="no baseline answer for uid 'fx-arena-2' \\(2 prompts"):
        mine.load_problems()


def test_a_mirror_is_read_with_each_parts_config_and_split(monkeypatch):
    calls = fake_hub(monkeypatch, lambda *_: [])
    make(ARCEval, dataset_name="me/arc-mirror").load_rows()
    assert calls == [
        ("me/arc-mirror", "ARC-Easy", "test"),
        ("me/arc-mirror", "ARC-Challenge", "test"),
    ]
    calls.clear()
    make(ARCEval, dataset_name="me/arc-mirror", dataset_split="validation").load_rows()
    assert [split for *_, split in calls] == ["validation", "validation"]


def test_one_repository_of_a_suite_spread_over_several(monkeypatch):
    calls = fake_hub(monkeypatch, lambda *_: [])
    make(AGIEvalEval, dataset_name="dmayhem93/agieval-lsat-ar").load_rows()
    assert calls == [("dmayhem93/agieval-lsat-ar", None, "test")]
    calls.clear()
    make(AGIEvalEval, dataset_name="dmayhem93/agieval-gaokao-physics").load_rows()  # not default
    assert calls == [("dmayhem93/agieval-gaokao-physics", None, "test")]
    calls.clear()
    make(AGIEvalEval, dataset_name="dmayhem93/agieval").load_rows()  # the family: the defaults
    assert len(calls) == 8 and calls[0] == ("dmayhem93/agieval-aqua-rat", None, "test")


def test_a_local_directory_of_split_files(tmp_path, monkeypatch):
    fake_hub(monkeypatch, lambda *_: pytest.fail("the hub must not be asked"))
    for part in MuSREval.suite.parts:  # MuSR's splits are its tasks
        lines = [json.dumps(row) for row in fixture_rows(part)]
        (tmp_path / f"{part.split}.jsonl").write_text("\n".join(lines) + "\n")
    found = make(MuSREval, dataset_name=str(tmp_path)).load_problems()
    assert found == make(MuSREval).load_problems()
    (tmp_path / "test.jsonl").write_text(json.dumps(fixture_rows(ARCEval.suite.parts[0])[0]) + "\n")
    [problem] = make(ARCEval, dataset_name=str(tmp_path)).load_problems()
    assert problem.subsets == {}  # both ARC parts read test.jsonl: no part to name


def test_a_local_file_and_the_rows_a_suite_leaves_out(tmp_path):
    rows = [
        {
            "query": "Q: Pick one. Answer Choices: (A)x (B)y",
            "choices": ["(A)x", "(B)y"],
            "gold": [1],
        },
        {
            "query": "Q: Pick all. Answer Choices: (A)x (B)y",
            "choices": ["(A)x", "(B)y"],
            "gold": [0, 1],
        },
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [problem] = make(AGIEvalEval, data_file=str(path)).load_problems()  # several golds: left out
    assert (problem.gold, problem.subsets) == ("B", {})
    assert problem.prompt.startswith("Q: Pick one.") and "A. x\nB. y" in problem.prompt
    [one] = make(AGIEvalEval, data_file=str(path), subsets=["sat-math"]).load_problems()
    assert one.subsets == {"subset": "sat-math"}  # one part named: the rows are its
