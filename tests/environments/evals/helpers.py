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


def answer(env: SuiteEval[Any], problem: Problem, right: bool = True) -> str:
    """A completion that states `problem`'s gold answer (`right`), or a wrong one, the way its
    suite's format asks for answers."""
    fmt, gold = env.suite.format, problem.gold
    if isinstance(fmt, MultipleChoice):
        return f"The best answer is: {gold if right else ('B' if gold == 'A' else 'A')}"
    if isinstance(fmt, YesNo):
        return f"Answer: {gold if right else ('no' if gold == 'yes' else 'yes')}"
    if isinstance(fmt, (BoxedMath, BoxedInteger)):
        boxed = (", ".join(gold) if isinstance(gold, list) else gold) if right else "123457"
        return f"So it is \\boxed{{{boxed}}}."
    if isinstance(fmt, Target):
        return f"Step by step it works out. So the answer is {gold if right else '(Q) quux'}."
    if isinstance(fmt, Spans):
        return "Reading the passage again.\nAnswer: " + ("; ".join(gold[0]) if right else "nobody")
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
