"""Shared pieces of the evaluation-environment tests: building envs, finding a prompt's problem,
running `evaluate` through the command line (or `atropos env evaluate NAME`) against a fake
server, reading what it wrote, and right and wrong answers in each suite's format."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.evals import ENVS, EvalEnv, Problem, SuiteEval
from atropos.environments.evals.formats import (
    BoxedInteger,
    BoxedMath,
    MultipleChoice,
    Spans,
    Target,
    YesNo,
)
from atropos.environments.evals.judged import ArenaPrompt, Conversation, ShortAnswer
from atropos.envs import cli
from atropos.testing import FakeInferenceServer

from ..helpers import EvalFiles

JUDGED = (ShortAnswer, Conversation, ArenaPrompt)  # formats whose answers a judge grades
GRADED = sorted(n for n, cls in ENVS.items() if not isinstance(cls.suite.format, JUDGED))


def make(cls: type[EvalEnv], **env: Any) -> EvalEnv:
    """An env with its defaults, changed by `env` (no server is contacted)."""
    config, servers = cls.config_init()
    return cls(config.model_copy(update=env), servers)


def problems(cls: type[EvalEnv], **env: Any) -> list[Problem]:
    return make(cls, **env).load_problems()


def finder(found: list[Problem]) -> Callable[[str], tuple[int, Problem]]:
    """`prompt text -> (index, problem)`: the problem whose prompt the text holds."""

    def find(text: str) -> tuple[int, Problem]:
        hits = [(i, p) for i, p in enumerate(found) if p.prompt in text]
        assert hits, f"no problem in {text[:200]!r}"
        return max(hits, key=lambda hit: len(hit[1].prompt))

    return find


def run_eval(
    cls: type[EvalEnv], responder: Callable[[str], Any], out: Path, *flags: str
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """`evaluate` through `atropos.envs.cli.main` against a fake server answering with
    `responder`; returns (the metrics, the samples, metrics.json's config_general)."""
    with FakeInferenceServer(responder=responder) as fake:
        argv = ["evaluate", "--openai.base_url", fake.base_url]
        argv += ["--env.data_dir_to_save_evals", str(out), *flags]
        assert cli.main(cls, argv) == 0
    written = EvalFiles(out)
    doc = written.doc
    assert doc["results"]["all"] == doc["results"][f"atropos|{cls.benchmark}|0"]
    return doc["results"]["all"], written.samples, doc["config_general"]


def run_named(
    name: str, responder: Callable[[str], Any], out: Path, *flags: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`atropos env evaluate NAME` (the registered name) against a fake server answering with
    `responder`; returns (the metrics, the samples)."""
    from atropos.cli.main import main as atropos_main

    with FakeInferenceServer(responder=responder) as fake:
        argv = ["env", "evaluate", name, "--openai.base_url", fake.base_url]
        assert atropos_main([*argv, "--env.data_dir_to_save_evals", str(out), *flags]) == 0
    written = EvalFiles(out)
    return written.doc["results"]["all"], written.samples


def right_answer(env: SuiteEval[Any], problem: Problem) -> str:
    """A completion that states `problem`'s gold answer the way its suite's format asks."""
    fmt = env.suite.format
    if isinstance(fmt, MultipleChoice):
        return f"The best answer is: {problem.gold}"
    if isinstance(fmt, YesNo):
        return f"Answer: {problem.gold}"
    if isinstance(fmt, (BoxedMath, BoxedInteger)):
        gold = ", ".join(problem.gold) if isinstance(problem.gold, list) else problem.gold
        return f"So it is \\boxed{{{gold}}}."
    if isinstance(fmt, Target):
        return f"Step by step it works out. So the answer is {problem.gold}."
    if isinstance(fmt, Spans):
        return "Reading the passage again.\nAnswer: " + "; ".join(problem.gold[0])
    raise TypeError(f"{type(fmt).__name__} is graded by a judge")


def wrong_answer(env: SuiteEval[Any], problem: Problem) -> str:
    """A completion that states a wrong answer to `problem`."""
    fmt = env.suite.format
    if isinstance(fmt, MultipleChoice):
        return f"The best answer is: {'B' if problem.gold == 'A' else 'A'}"
    if isinstance(fmt, YesNo):
        return f"Answer: {'no' if problem.gold == 'yes' else 'yes'}"
    if isinstance(fmt, (BoxedMath, BoxedInteger)):
        return "So it is \\boxed{123457}."
    if isinstance(fmt, Target):
        return "So the answer is (Q) quux."
    if isinstance(fmt, Spans):
        return "Answer: nobody"
    raise TypeError(f"{type(fmt).__name__} is graded by a judge")


def fake_hub(monkeypatch: pytest.MonkeyPatch, rows_of: Callable[..., Any]) -> list[tuple]:
    """Install a fake `datasets` whose `load_dataset` records its calls and returns
    `rows_of(name, config, split)`."""
    calls: list[tuple] = []

    def load_dataset(name: str, config: Any = None, split: Any = None, **kwargs: Any) -> Any:
        calls.append((name, config, split))
        return rows_of(name, config, split)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls
