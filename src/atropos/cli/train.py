"""`atropos train`: one flag per `TrainConfig` field, in kebab case (`--batch-size`).

argparse (`atropos.cli.argtypes.Parser`) reads the flags as text, with "did you mean" for a
misspelt one; `TrainConfig` validates them (and reads `ATROPOS_TRAIN_<FIELD>` variables below
the flags). A value that breaks a rule is one line naming the flag as typed, its rule and fix
(`atropos.envs.layering.validation_lines`): exit status 2, never a traceback.

`--check-args` parses and validates the flags and starts nothing: exit status 2 as above, or 0
with one JSON line on stdout saying where the trainer would start (`atropos launch` runs it
before a run: docs/launch.md, "Checks before anything starts"):
`{"steps": 20, "start_step": 20, "checkpoint": "runs/x/trainer/checkpoints/step_20", ...}`,
`start_step` being the step of the newest checkpoint in `--out-dir` (0 without one), as the
trainer itself resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr, ValidationError
from pydantic_settings import SettingsError

from atropos.cli.argtypes import Parser, usage_error

if TYPE_CHECKING:
    from atropos.trainer.train import TrainConfig

PROG = "atropos train"
ENV_PREFIX = "ATROPOS_TRAIN_"
_METAVARS = {  # what a field's value is, where its type alone says too little
    "model": "DIR|ID|tiny",
    "api_url": "URL",
    "server_url": "URL",
    "out_dir": "DIR",
    "server_command": "COMMAND",
    "device": "DEVICE",
    "lora_targets": "NAME[,NAME...]",
    "lease_seconds": "SECONDS",
    "patience": "SECONDS",
}
_TYPE_METAVARS: dict[Any, str] = {
    int: "INT",
    float: "FLOAT",
    str: "TEXT",
    Path: "PATH",
    SecretStr: "KEY",
}


CHECK_FLAG = "--check-args"


def main(argv: list[str]) -> int:
    """Parse `argv` into a `TrainConfig` and train; 2 on a bad flag, 1 on a failure."""
    check = CHECK_FLAG in argv
    cfg = parse([a for a in argv if a != CHECK_FLAG])
    if check:
        print(json.dumps(start_point(cfg)))
        return 0
    from atropos.client import ApiError, SyncError
    from atropos.trainer.train import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    problem = _tokenizer_problem(cfg.model)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 1
    try:
        last = train(cfg)
    except (ApiError, SyncError, ValueError, OSError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    if last:
        print(json.dumps(last))
    else:  # no step ran: say why rather than print an empty mapping
        print(f"{PROG}: {_nothing_trained(cfg)}", file=sys.stderr)
    return 0


def resume_point(out_dir: Path) -> tuple[Path | None, int | None]:
    """The newest complete checkpoint in `out_dir` and its step, where the trainer resumes
    (`atropos.trainer.checkpoint.latest_checkpoint`, the step from its ``state.json`` as
    `load_optimizer` reads it); (None, 0) without one; (path, None) when its state is unreadable.
    The checkpoint module (and torch) is imported only when a checkpoint may be there."""
    if not any((out_dir / "checkpoints").glob("step_*")):
        return None, 0
    from atropos.trainer.checkpoint import latest_checkpoint

    path = latest_checkpoint(out_dir)
    if path is None:
        return None, 0
    try:
        return path, int(json.loads((path / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return path, None


def start_point(cfg: TrainConfig) -> dict[str, Any]:
    """What `--check-args` prints: the steps to reach and the step the trainer would start at."""
    checkpoint, step = resume_point(cfg.out_dir)
    return {
        "steps": cfg.steps,
        "start_step": step,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "out_dir": str(cfg.out_dir),
    }


def _nothing_trained(cfg: TrainConfig) -> str:
    checkpoint, step = resume_point(cfg.out_dir)
    if checkpoint is not None and step is not None and step >= cfg.steps:
        return (
            f"nothing to train: the newest checkpoint ({checkpoint}) is at step {step} and"
            f" --steps is {cfg.steps}; raise --steps to train further"
        )
    return "no step was trained (stopped before the first step)"


def parse(argv: list[str]) -> TrainConfig:
    """The `TrainConfig` of `argv` (and `ATROPOS_TRAIN_*` variables); SystemExit(2) with one
    line per problem on bad flags or values, SystemExit(0) after `--help`."""
    from atropos.envs.layering import validation_lines
    from atropos.trainer.train import TrainConfig

    given = dict(vars(build_parser().parse_args(argv)))
    given.pop("check_args", None)  # main's, not TrainConfig's
    try:
        return TrainConfig(**given)
    except ValidationError as err:
        labels = {
            field: _variable(field)
            for field in TrainConfig.model_fields
            if field not in given and _variable(field) in _variables()
        }
        usage_error(PROG, "\n".join(validation_lines(err, TrainConfig, _flag_of, labels)))
    except SettingsError as err:  # an ATROPOS_TRAIN_* value pydantic-settings cannot read
        usage_error(PROG, f"{ENV_PREFIX}* variables: {err}")


def build_parser() -> argparse.ArgumentParser:
    """The parser of `atropos train`: every field a flag with its description and default."""
    from atropos.trainer.train import TrainConfig

    p = Parser(
        prog=PROG,
        allow_abbrev=False,
        description="The reference GRPO trainer: it leases batches from the trajectory API,"
        " trains on them and sends the new weights to the inference server (docs/trainer.md)."
        f" Every flag can also be set as a variable: {ENV_PREFIX}BATCH_SIZE=8 for"
        " --batch-size 8 (a flag wins).",
        epilog="example, with `atropos api serve` and `atropos local serve tiny` running:"
        " atropos train --model tiny --batch-size 8 --steps 20",
    )
    for name, info in TrainConfig.model_fields.items():
        text = (info.description or "").replace("%", "%%")
        if info.is_required():
            text += " (required)"
        elif not _secret(info.annotation):
            text += f" (default: {_show(info.default)})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": text}
        kind = _kind(info.annotation)
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            kwargs["choices"] = [str(c) for c in typing.get_args(kind)]
        else:
            kwargs["metavar"] = _METAVARS.get(name) or _TYPE_METAVARS.get(kind, "VALUE")
            if typing.get_origin(kind) is list:
                kwargs["type"] = _names
        p.add_argument(_flag_of((name,)), **kwargs)
    p.add_argument(
        CHECK_FLAG,
        action="store_true",
        default=argparse.SUPPRESS,
        help="check the flags and exit, starting nothing: 0 with one JSON line (the steps to"
        " reach, the step it would start at), or 2 with the usage errors",
    )
    return p


def _flag_of(loc: tuple[int | str, ...]) -> str:
    """`("batch_size",)` -> `--batch-size` (an item of a list: `--lora-targets[0]`)."""
    if not loc:
        return PROG
    return "--" + str(loc[0]).replace("_", "-") + "".join(f"[{p}]" for p in loc[1:])


def _variable(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _variables() -> set[str]:
    return {name.upper() for name in os.environ}  # pydantic-settings ignores the case


def _kind(annotation: Any) -> Any:
    """The annotation without `| None` (`str | None` -> `str`)."""
    from atropos.envs.layering import union_members

    members = [a for a in union_members(annotation) if a is not type(None)]
    return members[0] if len(members) == 1 else annotation


def _secret(annotation: Any) -> bool:
    return _kind(annotation) is SecretStr


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "unset" if value is None else "''" if value == "" else str(value)


def _names(text: str) -> list[str]:
    """`q_proj,v_proj` (or a JSON list) -> `["q_proj", "v_proj"]`."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(f"not a JSON list: {err}") from None
        if not isinstance(value, list):
            raise argparse.ArgumentTypeError("expected a list of names")
        return [str(v) for v in value]
    return [name.strip() for name in text.split(",") if name.strip()]


def _tokenizer_problem(model: str) -> str | None:
    """Why `model`'s tokenizer cannot be loaded, named as `--model` (None: it loads; the
    trainer then finds it in the tokenizer cache)."""
    from atropos.inference.tokenizer import load_tokenizer

    try:
        load_tokenizer(model)
    except ValueError as err:
        cause = err.__context__ or err  # load_tokenizer's words name an environment's flag
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        return (
            f"--model {model}: cannot load its tokenizer ({reason}); pass a Hugging Face model"
            " directory, a Hub model id this machine can reach, or 'tiny' for the tiny policy"
            " that ships with atropos"
        )
    return None
