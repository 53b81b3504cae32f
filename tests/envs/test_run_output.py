"""What a run prints: the resolved configuration only with --verbose (a line names its file),
evaluate's metrics once, a usage error found in setup as one line with exit 2, the trainer's
command while serve waits for one, and what to do when every group is dropped."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from atropos.api import ApiConfig, create_app
from atropos.envs.cli import main
from atropos.envs.config import ConfigError
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.runner.serve import ServeRunner
from atropos.envs.runner.watch import IDENTICAL_SCORES_HINT, DropReport, drop_hint
from atropos.testing import serve_in_thread

from .arith import Addition
from .synth import SynthEnv, resolved

MODES = ["serve", "process", "evaluate"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every run writes under a fresh working directory, with no ATROPOS_* settings."""
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("ATROPOS_")]:
        monkeypatch.delenv(var)
    return tmp_path


class Quick(Addition):
    name = "quick"


class SetupRefuses(Addition):
    """An env whose setup finds a usage error (as reasoning_gym's misspelt task)."""

    name = "refuses"

    async def setup(self) -> None:
        raise ConfigError("--env.split: no split 'tset'; did you mean 'test'?")


def no_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve without an API: the run ends before registering (the config is written first)."""
    from atropos.envs.runner import serve

    async def refuse(self: Any, request: Any, deadline: float, stopper: Any = None) -> Any:
        raise serve.ApiError("no API in this test")

    monkeypatch.setattr(serve.ControlClient, "register", refuse)


@pytest.mark.parametrize("mode", MODES)
def test_the_config_is_written_and_named_in_one_line_not_printed(
    mode, capsys, caplog, in_tmp, monkeypatch
):
    no_trainer(monkeypatch)
    with caplog.at_level(logging.WARNING, "atropos.env"):
        main(Quick, [mode, "--testing", "--env.total_steps", "2"], prog="quick")
    err = capsys.readouterr().err
    assert "mode: " not in err and "group_size:" not in err  # no YAML dump
    (line,) = [r.getMessage() for r in caplog.records if "configuration:" in r.getMessage()]
    path = in_tmp / line.split("configuration: ")[1].split(" (")[0]
    assert path.is_file() and f"mode: {mode}" in path.read_text()
    assert "--verbose prints it" in line
    expected = {
        "serve": "runs/quick/config.yaml",
        "process": "data/quick.config.yaml",
        "evaluate": "runs/quick/evaluate_config.yaml",
    }
    assert line.startswith(f"configuration: {expected[mode]}")


@pytest.mark.parametrize("flag", ["--verbose", "-v"])
def test_verbose_prints_the_resolved_config(flag, capsys, caplog):
    main(Quick, ["process", "--testing", "--env.total_steps", "1", flag], prog="quick")
    err = capsys.readouterr().err
    assert "mode: process" in err and "group_size:" in err
    assert "configuration:" not in caplog.text  # the dump says it all


def test_the_process_page_highlights_tokens_with_the_runs_tokenizer(in_tmp):
    assert main(Quick, ["process", "--testing", "--env.total_steps", "1"], prog="quick") == 0
    page = (in_tmp / "data" / "quick.html").read_text()
    assert '"tokenizer":"tiny"' in page and "Token highlighting needs" not in page


def test_evaluate_prints_its_metrics_once(caplog):
    with caplog.at_level(logging.WARNING, "atropos.env"):
        assert main(Quick, ["evaluate", "--testing"], prog="quick") == 0
    shown = [r.getMessage() for r in caplog.records if "eval/" in r.getMessage()]
    assert len(shown) == 1, shown
    last = caplog.records[-1].getMessage()
    assert last == "evaluated: metrics above, in runs/quick/metrics.jsonl"


def test_evaluate_of_an_env_that_logs_nothing_prints_the_result(caplog):
    class Silent(Quick):
        async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
            return {"eval/x": 1.0}

    assert main(Silent, ["evaluate", "--testing"], prog="silent") == 0
    assert "evaluated: {'eval/x': 1.0}" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_a_usage_error_in_setup_is_one_line_and_exit_2(mode, capsys, caplog, monkeypatch):
    no_trainer(monkeypatch)
    assert main(SetupRefuses, [mode, "--testing"], prog="refuses") == 2
    err = capsys.readouterr().err
    assert err == f"refuses {mode}: error: --env.split: no split 'tset'; did you mean 'test'?\n"
    assert "Traceback" not in caplog.text and "setup failed" not in caplog.text


def test_serve_waiting_for_a_trainer_names_the_command_to_start_one(tmp_path, caplog):
    with serve_in_thread(create_app(ApiConfig())) as url:
        cfg = resolved(rollout_server_url=url, register_timeout=0.5)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        assert asyncio.run(ServeRunner(env, cfg, tmp_path).run()) == 1
    waiting = [r.getMessage() for r in caplog.records if "waiting to register" in r.getMessage()]
    assert waiting and f"atropos train --model tiny --api-url {url}" in waiting[0]
    assert "docs/trainer.md" in waiting[0]


# ----- every group dropped ---------------------------------------------------------------------


def test_the_hint_comes_only_when_nearly_every_group_goes_for_equal_scores():
    assert drop_hint(Counter(identical_scores=100), sent=0) == IDENTICAL_SCORES_HINT
    assert drop_hint(Counter(identical_scores=97), sent=3) == IDENTICAL_SCORES_HINT
    assert drop_hint(Counter(identical_scores=90), sent=10) is None  # some signal
    assert drop_hint(Counter(too_long=100), sent=0) is None  # another cause, another fix
    assert drop_hint(Counter(), sent=0) is None
    assert "--env.ensure_scores_are_not_same false" in IDENTICAL_SCORES_HINT
    assert "--env.group_size" in IDENTICAL_SCORES_HINT and "graded" in IDENTICAL_SCORES_HINT


def test_the_drop_line_ends_with_the_hint(caplog):
    now = [0.0]
    report = DropReport(every=30, clock=lambda: now[0])
    now[0] = 5.0
    line = report.check(Counter(identical_scores=40), Counter(), sent=0)
    assert line is not None and line.endswith(IDENTICAL_SCORES_HINT)
    assert line.startswith("dropped 100% of groups in the last 5 s (identical_scores 40)")
    now[0] = 40.0
    mixed = report.check(Counter(identical_scores=70), Counter(), sent=20)
    assert mixed is not None and IDENTICAL_SCORES_HINT not in mixed  # 60% dropped: no hint


class AllEqual(SynthEnv):
    """Pass/fail scores on a policy that always fails: every group's scores are equal."""

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, more = await super().collect_trajectories(item)
        group["scores"] = [0.0] * len(group["scores"])
        return group, more


def test_process_says_what_to_do_when_every_group_is_dropped(tmp_path, caplog):
    out = tmp_path / "equal.jsonl"
    cfg = resolved(
        "process", total_steps=4, data_path_to_save_groups=str(out), ensure_scores_are_not_same=True
    )
    env = AllEqual(cfg.env, cfg.servers, manager=cfg.manager)
    runner = ProcessRunner(env, cfg)
    runner.barren_limit = 10
    assert asyncio.run(runner.run(show_progress=False)) == 1
    lines = [r.getMessage() for r in caplog.records]
    (stop,) = [m for m in lines if "gave no group to write" in m]
    assert stop.endswith(IDENTICAL_SCORES_HINT)
    assert sum(IDENTICAL_SCORES_HINT in m for m in lines) == 1  # said once, not in the summary
    assert json.loads(out.with_suffix(".metrics.json").read_text())["groups"] == 0
