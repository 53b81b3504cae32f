"""Checks before anything starts (`atropos.launch.preflight`): every process's arguments through
its own command's `--check-args`, a run that is complete already or resumed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from atropos.cli import launch as cli
from atropos.cli import main as atropos_main
from atropos.cli import train as train_cli
from atropos.launch import config, preflight
from atropos.launch.plan import build

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "launch" / "local.yaml"
GPU = ROOT / "examples" / "launch" / "gpu-vllm.yaml"


def _launch(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _finished(run_dir: Path, step: int) -> Path:
    """A run directory whose trainer checkpointed step `step` (what the trainer resumes from)."""
    checkpoint = run_dir / "trainer" / "checkpoints" / f"step_{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"step": step, "batch_ids": []}))
    return checkpoint


# ----- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("real", [False, True], ids=["dry-run", "run"])
def test_a_bad_trainer_argument_is_one_usage_error_naming_its_key(
    real: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "r"
    argv = [str(LOCAL), "--set", f"run.directory={run_dir}", "--set", "trainer.args.batch-size=abc"]
    started = time.monotonic()
    code, out, err = _launch(capsys, *argv, *([] if real else ["--dry-run"]))
    assert code == 2
    assert time.monotonic() - started < 20
    (line,) = err.splitlines()
    assert line.startswith(f"atropos launch: error: {LOCAL}: trainer.args.batch-size: ")
    assert "(got 'abc')" in line and line.endswith("[trainer: atropos train]")
    assert "Traceback" not in err and out == ""
    assert not run_dir.exists()  # nothing started, nothing written


def test_every_component_is_checked_and_each_mistake_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [
        f"run.directory={tmp_path / 'r'}", "api.args.max-staleness=q",
        "inference.0.args.max-batch-size=0", "envs.0.env.group_size=x", "envs.0.replicas=2",
        "trainer.args.stepz=3",
    ]  # fmt: skip
    code, _, err = _launch(capsys, str(LOCAL), "--dry-run", *[f"--set={s}" for s in sets])
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 4, err  # the two replicas of the env share one check
    expected = [
        ("api.args.max-staleness: invalid non_negative_int value: 'q'", "[api: atropos api serve]"),
        ("inference[0].args.max-batch-size: --max-batch-size must be at least 1, got 0",
         "[policy: atropos local serve]"),
        ("trainer.args.stepz: unknown flag --stepz; did you mean --steps?",
         "[trainer: atropos train]"),
        ("envs[0].env.group_size: Input should be a valid integer",
         "[arithmetic-0, arithmetic-1: atropos env serve]"),
    ]  # fmt: skip
    for (key, tail), line in zip(expected, lines, strict=True):
        assert line.startswith(f"atropos launch: error: {LOCAL}: {key}"), line
        assert line.endswith(tail), line


def test_good_arguments_pass_quickly(tmp_path: Path) -> None:
    """The shipped example's four checks (api, policy, trainer, env) run at once, in seconds."""
    run = config.load(LOCAL, [f"run.directory={tmp_path / 'r'}"])
    plan = build(run)
    outcome = preflight.check(plan, run, str(LOCAL))
    assert outcome.errors == [] and outcome.notes == []
    assert outcome.trainer == {
        "steps": 20, "start_step": 0, "checkpoint": None, "out_dir": str(plan.run_dir / "trainer"),
    }  # fmt: skip
    assert outcome.seconds < 15


def test_commands_without_a_check_mode_are_left_alone(tmp_path: Path) -> None:
    run = config.load(GPU, [f"run.directory={tmp_path / 'r'}", "trainer.args.stepz=1"])
    plan = build(run)
    scratch = tmp_path / "scratch"
    found = {c.section: c for c in preflight.checks(plan, scratch)}
    assert set(found) == {"api", "trainer", "envs[0]", "envs[1]"}  # vLLM has no check mode
    trainer = found["trainer"].argv  # the torchrun form is checked as atropos train
    assert trainer[1:4] == ["-m", "atropos", "train"] and trainer[-1] == "--check-args"
    assert "torch.distributed.run" not in trainer
    own = config.load(LOCAL, ["trainer.model=null", "trainer.args={}", "trainer.command=./t.sh"])
    assert "trainer" not in {c.section for c in preflight.checks(build(own), scratch)}


def test_an_environments_config_file_is_written_for_its_check(tmp_path: Path) -> None:
    run = config.load(LOCAL, [f"run.directory={tmp_path / 'r'}"])
    scratch = tmp_path / "scratch"
    (env,) = [c for c in preflight.checks(build(run), scratch) if c.role == "env"]
    given = env.argv[env.argv.index("--config") + 1]
    assert given == str(scratch / "config" / "arithmetic.yaml")
    assert "base_url: 'http://127.0.0.1:1/v1'" in Path(given).read_text()
    assert env.environ["ATROPOS_API_KEY"] == preflight.STAND_IN_KEY  # local serve: a keyed run


@pytest.mark.parametrize(
    ("section", "flag", "expected"),
    [
        ("trainer", "--batch-size", "trainer.args.batch-size"),
        ("trainer", "--model", "trainer.model"),
        ("trainer", "--api-url", None),  # launch's own flag
        ("envs[0]", "--env.group_size", "envs[0].env.group_size"),
        ("envs[0]", "--env.inference_weight", "envs[0].weight"),
        ("api", "--max-staleness", "api.args.max-staleness"),
        ("inference[0]", "--seed", "inference[0].args.seed"),
        ("inference[3]", "--seed", None),
    ],
)
def test_a_flag_is_traced_to_its_run_file_key(
    section: str, flag: str, expected: str | None
) -> None:
    run = config.load(LOCAL, ["envs.0.weight=2"])
    assert preflight.key_path(run, section, flag) == expected


# ----- a complete run ----------------------------------------------------------------------------


def test_a_complete_run_says_so_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "r"
    checkpoint = _finished(run_dir, 20)
    code, out, err = _launch(capsys, str(LOCAL), "--set", f"run.directory={run_dir}")
    assert code == 0 and out == ""
    (line,) = err.splitlines()
    assert "run 'arithmetic-local' is complete: its trainer is at step 20 of 20" in line
    assert str(checkpoint) in line and "nothing was started" in line
    assert "--set trainer.args.steps=N with N above 20" in line
    assert f"--set run.directory=NEW_DIR, or remove {run_dir}" in line
    assert sorted(p.name for p in run_dir.iterdir()) == ["trainer"]  # no logs, plan or store


def test_a_complete_run_can_be_extended_and_a_dry_run_notes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "r"
    _finished(run_dir, 20)
    code, out, err = _launch(capsys, str(LOCAL), "--dry-run", f"--set=run.directory={run_dir}")
    assert code == 0 and "step 1: start" in out
    assert err.startswith("atropos launch: note: run 'arithmetic-local' is complete")
    assert "a launch would start nothing" in err
    run = config.load(LOCAL, [f"run.directory={run_dir}", "trainer.args.steps=40"])
    plan = build(run)
    outcome = preflight.check(plan, run, str(LOCAL))
    assert outcome.trainer is not None and outcome.trainer["start_step"] == 20
    assert preflight.complete(plan, outcome.trainer) is None  # 20 of 40: it trains on


def test_the_trainer_says_why_it_trained_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rather than print `{}` (no step's metrics) when it resumed at its last step."""
    import atropos.trainer.train

    _finished(tmp_path, 5)
    monkeypatch.setattr(atropos.trainer.train, "train", lambda cfg: {})
    monkeypatch.setattr(train_cli, "_tokenizer_problem", lambda model: None)
    out_dir = str(tmp_path / "trainer")
    assert train_cli.main(["--model", "tiny", "--steps", "5", "--out-dir", out_dir]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "nothing to train: the newest checkpoint" in captured.err
    assert "is at step 5 and --steps is 5; raise --steps" in captured.err


# ----- the component commands' --check-args -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["api", "serve", "--max-staleness", "2"], 0),
        (["api", "serve", "--host", "0.0.0.0"], 2),  # no key: refused, as a start would be
        (["local", "serve", "tiny", "--seed", "0"], 0),
        (["local", "serve", "no/such/dir"], 2),
        (["env", "serve", "arithmetic", "--env.group_size", "4"], 0),
        (["env", "serve", "arithmetic", "--env.group_sise", "4"], 2),
        (["train", "--model", "tiny", "--steps", "0"], 2),
    ],
)
def test_check_args_starts_nothing(
    argv: list[str], code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    try:
        got = atropos_main.main([*argv, "--check-args"])
    except SystemExit as exit_:
        got = int(exit_.code or 0)
    assert got == code, capsys.readouterr().err


def test_train_check_args_prints_where_it_would_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _finished(tmp_path, 7)
    out_dir = str(tmp_path / "trainer")
    assert train_cli.main(["--model", "tiny", "--out-dir", out_dir, "--check-args"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "steps": 100, "start_step": 7, "checkpoint": str(checkpoint), "out_dir": out_dir,
    }  # fmt: skip


def test_a_resumed_run_starts_its_environments_after_the_trainer_registered_anew(
    tmp_path: Path,
) -> None:
    """The API's store still holds the finished run's registration: an environment that
    registered before the trainer did anew would read "the trainer reached its last step"."""
    run = config.load(LOCAL, [f"run.directory={tmp_path / 'r'}", "envs.0.replicas=2"])
    fresh = build(run)
    assert not preflight.resumed(fresh, {"steps": 20, "start_step": 0})
    assert [p.name for p in fresh.tiers()[1]] == ["trainer", "arithmetic-0", "arithmetic-1"]
    plan = build(run)
    assert preflight.resumed(plan, {"steps": 40, "start_step": 20})
    assert plan.get("trainer").gate.log == preflight.TRAINER_REGISTERED
    assert [[p.name for p in tier] for tier in plan.tiers()][1:] == [
        ["trainer"], ["arithmetic-0", "arithmetic-1"],
    ]  # fmt: skip


def test_a_slurm_run_is_checked_with_the_nodes_python_when_it_is_here(tmp_path: Path) -> None:
    slurm = ROOT / "examples" / "launch" / "slurm.yaml"
    here = config.load(slurm, [f"run.slurm.python={sys.executable}"])
    assert preflight.check_python(here) == sys.executable
    away = config.load(slurm, [f"run.slurm.python={tmp_path / 'no-python'}"])
    assert preflight.check_python(away) is None
    outcome = preflight.check(build(away), away, str(slurm))
    assert outcome.errors == [] and outcome.trainer is None
    (note,) = outcome.notes
    assert "is not on this machine" in note
