"""Shared pieces of the evaluation-environment tests: building envs, finding a prompt's problem,
running `evaluate` through the command line against a fake server, reading what it wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from atropos.environments.evals import EvalEnv, Problem
from atropos.envs import cli
from atropos.testing import FakeInferenceServer

from ..helpers import EvalFiles


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
