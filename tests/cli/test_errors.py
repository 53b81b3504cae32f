"""The command line's errors: flag errors instead of pydantic's, "did you mean" on every
command, a busy port before any "listening" line, bare `atropos`, the trainer's help."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from atropos.cli.main import main


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atropos", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def clean(text: str) -> None:
    """No traceback and no pydantic link: the user sees our words only."""
    assert "Traceback" not in text and "errors.pydantic.dev" not in text


def usage_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `atropos ARGV` in this process; it must end with status 2; its stderr."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    clean(err)
    return err


# ---- 1 and 2: pydantic's errors as flag errors; atropos train -------------------------------


def test_train_without_model_says_what_model_takes() -> None:
    done = run("train")
    assert done.returncode == 2
    clean(done.stderr)
    assert done.stderr.startswith("atropos train: error: --model is required: ")
    assert "a Hugging Face model directory" in done.stderr and "--model tiny" in done.stderr
    assert done.stderr.count("\n") == 1  # one problem, one line


def test_a_missing_model_directory_is_named_as_the_trainers_flag() -> None:
    done = run("train", "--model", "/nonexistent")
    assert done.returncode == 2
    clean(done.stderr)
    assert "atropos train: error: --model: no directory /nonexistent" in done.stderr
    assert "--model tiny" in done.stderr and "tokenizer_name" not in done.stderr


def test_a_model_directory_without_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_exit(["train", "--model", str(tmp_path)], capsys)
    assert f"--model: {tmp_path} has no config.json: not a Hugging Face model directory" in err


def test_each_bad_value_is_one_line_naming_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_exit(["train", "--model", "tiny", "--batch-size", "0", "--steps", "ten"], capsys)
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("atropos train: error: --") for line in lines)
    assert "--batch-size: Input should be greater than or equal to 1 (got '0')" in err
    assert "--steps: Input should be a valid integer" in err
    assert lines[-1].endswith("(see: atropos train --help)")


def test_a_bad_variable_is_named_with_its_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATROPOS_TRAIN_BATCH_SIZE", "0")
    err = usage_exit(["train", "--model", "tiny"], capsys)
    assert "--batch-size (from ATROPOS_TRAIN_BATCH_SIZE): Input should be greater" in err


def test_train_reads_its_flags_into_the_config(tmp_path: Path) -> None:
    from atropos.cli.train import parse
    from atropos.tiny.warmstart import policy_path

    cfg = parse(
        ["--model", "tiny", "--lora-targets", "q_proj,k_proj", "--no-wandb", "--sync", "lora"]
        + ["--out-dir", str(tmp_path), "--api-key", "k", "--lr", "0.5"]
    )
    assert cfg.model == str(policy_path()) and cfg.lora_targets == ["q_proj", "k_proj"]
    assert cfg.sync == "lora" and cfg.wandb is False and cfg.lr == 0.5
    assert cfg.out_dir == tmp_path and cfg.api_key is not None
    assert cfg.api_key.get_secret_value() == "k"
    assert parse(["--model", "tiny", "--lora-targets", '["a"]', "--wandb"]).lora_targets == ["a"]


def test_an_unloadable_hub_model_is_named_as_the_trainers_flag(tmp_path: Path) -> None:
    done = run(
        "train", "--model", "no-such-org/no-such-model", "--out-dir", str(tmp_path),
        env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 1
    assert "--model no-such-org/no-such-model: cannot load its tokenizer" in done.stderr
    assert "tokenizer_name" not in done.stderr and "Traceback" not in done.stderr


def test_train_help_describes_every_flag_in_plain_types() -> None:
    from atropos.cli.train import build_parser

    parser = build_parser()
    flags = [a for a in parser._actions if a.dest != "help"]
    assert len(flags) > 30
    for action in flags:
        assert action.help and action.help.split(" (default")[0].strip(), action.dest
    text = parser.format_help()
    for shown in ("--api-key KEY", "--steps INT", "--lr FLOAT", "--wandb-name TEXT"):
        assert shown in text
    assert "--model DIR|ID|tiny" in text and "(required)" in text
    assert "(default: 64)" in text and "(default: unset)" in text
    assert "SecretStr" not in text and "null" not in text and "list[str]" not in text


def test_the_renderer_names_flags_hides_secrets_and_uses_validators_words() -> None:
    from atropos.envs.layering import validation_lines

    class Model(BaseModel):
        size: int = Field(ge=1, description="how big")
        token: SecretStr = SecretStr("")
        name: str = "x"

        @field_validator("name")
        @classmethod
        def _name(cls, value: str) -> str:
            if value == "bad":
                raise ValueError("bad is not a name: pick another")
            return value

    with pytest.raises(ValidationError) as caught:
        Model.model_validate({"token": 5, "name": "bad"})
    lines = validation_lines(caught.value, Model, lambda loc: f"--{loc[0]}", {"name": "f.yaml"})
    assert lines == [
        "--size is required: how big",
        "--token: Input should be a valid string",  # the value of a secret is never echoed
        "--name (from f.yaml): bad is not a name: pick another",
    ]


# ---- 3: "did you mean" on every command ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["api", "serve", "--prot", "8001"], "atropos api serve: error: unknown flag --prot;"
         " did you mean --port? (see: atropos api serve --help)"),
        (["local", "serve", "tiny", "--prot", "1"], "atropos local serve: error: unknown flag"
         " --prot; did you mean --port?"),
        (["train", "--modle", "x"], "atropos train: error: unknown flag --modle; did you mean"
         " --model?"),
        (["train", "--model", "tiny", "--sync", "relaod"], "invalid choice 'relaod'; did you"
         " mean reload?"),
        (["export", "sft", "out.jsonl", "--inptu", "a"], "atropos export sft: error: unknown"
         " flag --inptu; did you mean --input?"),
        (["view", "a.jsonl", "--limt", "3"], "atropos view: error: unknown flag --limt; did you"
         " mean --limit?"),
        (["demo", "--stesp", "3"], "atropos demo: error: unknown flag --stesp; did you mean"
         " --steps?"),
        (["trian"], "atropos: error: argument COMMAND: invalid choice 'trian'; did you mean"
         " train?"),
    ],
)  # fmt: skip
def test_a_misspelt_flag_or_command_names_the_nearest(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_exit(argv, capsys)
    assert expected in err and err.count("\n") == 1


def test_run_api_names_the_nearest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from atropos.cli.compat import run_api

    with pytest.raises(SystemExit) as exited:
        run_api(["--prot", "8001"])
    assert exited.value.code == 2
    assert "run-api: error: unknown flag --prot; did you mean --port?" in capsys.readouterr().err


def test_a_bad_value_of_a_typed_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_exit(["api", "serve", "--max-staleness", "-1"], capsys)
    assert "atropos api serve: error: argument --max-staleness: expected 0 or more, got -1" in err


# ---- 4: a busy port, before any "listening" line ---------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.parametrize(
    "argv", [["api", "serve", "--store", "memory"], ["local", "serve", "tiny", "--device", "cpu"]]
)
def test_a_busy_port_is_one_error_and_nothing_says_listening(
    argv: list[str], busy_port: int
) -> None:
    done = run(*argv, "--port", str(busy_port))
    assert done.returncode == 1
    clean(done.stderr)
    prog = " ".join(["atropos", *argv[:2]])
    assert done.stderr == (
        f"{prog}: error: port {busy_port} on 127.0.0.1 is in use: pick another with --port,"
        " or stop what listens there\n"
    )
    assert done.stdout == ""  # no "atropos api: http://..." line


def test_an_address_not_of_this_machine_names_host() -> None:
    from atropos.cli.listen import bind

    with pytest.raises(SystemExit, match="--host 192.0.2.1 is not an address of this machine"):
        bind("192.0.2.1", 0, "x")  # TEST-NET-1: never assigned to a machine


# ---- 5: bare atropos ---------------------------------------------------------------------------


def test_bare_atropos_prints_the_commands_and_exits_0() -> None:
    done = run()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: atropos ")
    for line in ("api       the trajectory API", "train     the reference GRPO trainer"):
        assert line in done.stdout


# ---- 6: YAML suggestions name the key path, the file once ------------------------------------


def test_a_yaml_suggestion_names_the_key_path_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad2.yaml"
    bad.write_text("env:\n  group_sise: 4\n")
    assert main(["env", "process", "arithmetic", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: env.group_sise: unknown setting; did you mean env.group_size?" in err
    assert err.count("bad2.yaml") == 1
    bad.write_text("opnai: {}\n")
    assert main(["env", "process", "arithmetic", "--config", str(bad)]) == 2
    assert f"{bad}: opnai: unknown setting; did you mean openai?" in capsys.readouterr().err
