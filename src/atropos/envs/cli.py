"""The command line of one environment: `MyEnv.cli()` and `atropos env serve|process|evaluate NAME`.

Flags are generated from the config models (argparse): `--env.FIELD`, `--openai.FIELD`, the
manager's `--slurm`, `--testing`, `--max_n_completions`, `--proxy_url`, `--config FILE`, and
`--verbose` (`-v`: print the resolved configuration, which the run writes to its files anyway).
This module only builds the parser and reads it: which flags exist and their defaults come from
`atropos.envs.layering.flag_sections`, and the parsed values are layered there, once
(`flags_layer`, `resolve_config`), in the order its module docstring lists.
"""

from __future__ import annotations

import argparse
import enum
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml
from pydantic import BaseModel

from atropos.envs.config import MODES, ConfigError, Mode, ResolvedConfig
from atropos.envs.layering import (
    FlagSections,
    env_name,
    flag_sections,
    flags_layer,
    resolve_config,
    union_members,
)
from atropos.envs.registry import missing_extras
from atropos.names import did_you_mean

__all__ = ["MODE_HELP", "cli_main", "main", "parse", "run_mode", "show"]

MODE_HELP: dict[Mode, str] = {
    "serve": "send scored rollouts to the trajectory API (training)",
    "process": "write scored rollout groups to a JSONL file (no trainer needed)",
    "evaluate": "run the environment's evaluation once",
}


@dataclass(frozen=True)
class _Flag:
    """One generated flag, e.g. `--env.group_size` (section "env", key "group_size")."""

    section: str  # "env", "openai", or "" for the server manager
    key: str
    boolean: bool

    @property
    def option(self) -> str:
        """The flag as typed."""
        return f"--{self.section}.{self.key}" if self.section else f"--{self.key}"


class _Parser(argparse.ArgumentParser):
    """Raises ConfigError instead of exiting, so every usage error ends the same way (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see: {self.prog} --help)")


def cli_main(env_cls: type, argv: Sequence[str] | None = None) -> NoReturn:
    """`MyEnv.cli()`: parse `argv` (default `sys.argv[1:]`), run, and exit with the run's status."""
    raise SystemExit(main(env_cls, argv))


def main(env_cls: type, argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """`PROG {serve,process,evaluate} [flags]` for `env_cls`; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    top = _Parser(prog=prog, description=f"Run the {env_name(env_cls)} environment.")
    top.add_argument("mode", choices=MODES, metavar="{serve,process,evaluate}", help="run mode")
    top.add_argument("flags", nargs=argparse.REMAINDER, help="see: MODE --help")
    top.epilog = "\n".join(f"  {m:<9} {h}" for m, h in MODE_HELP.items())
    top.formatter_class = argparse.RawDescriptionHelpFormatter
    try:
        if args and not args[0].startswith("-") and args[0] not in MODES:
            hint = did_you_mean(args[0], MODES)
            raise ConfigError(f"unknown mode {args[0]!r}{hint} (see: {top.prog} --help)")
        ns = top.parse_args(args)
    except ConfigError as e:
        print(f"{top.prog}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    return run_mode(env_cls, ns.mode, ns.flags, prog=f"{top.prog} {ns.mode}")


def run_mode(env_cls: type, mode: Mode, argv: Sequence[str], *, prog: str | None = None) -> int:
    """Resolve the configuration from `argv`, print it (secrets removed), and run `mode`."""
    prog = prog or f"{env_name(env_cls)} {mode}"
    try:
        resolved = parse(env_cls, mode, argv, prog=prog)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    missing = missing_extras(env_cls, env_name(env_cls))
    if missing is not None:  # named before any work starts, not once per item
        print(f"{prog}: error: {missing}", file=sys.stderr)
        return 2
    if mode != "evaluate" and getattr(env_cls, "evaluation_only", False):
        # refused before anything is written or any server is asked: a test set is never
        # trained on by accident
        name = env_name(env_cls)
        print(
            f"{prog}: error: {name} is an evaluation-only environment;"
            f" use `atropos env evaluate {name}`",
            file=sys.stderr,
        )
        return 2
    show(env_cls, resolved, verbose=resolved.verbose)
    from atropos.envs import runner  # looked up now, so tests can replace runner.run

    return int(runner.run(env_cls, resolved))


def parse(
    env_cls: type, mode: Mode, argv: Sequence[str], *, prog: str | None = None
) -> ResolvedConfig:
    """The resolved configuration of `env_cls` in `mode` given command-line `argv`.

    Raises:
        ConfigError: an unknown flag (with a suggestion), or a value that breaks a rule.
        SystemExit: after printing `--help`.
    """
    sections = flag_sections(env_cls, mode)
    flags = _flags(sections.models)
    parser = _parser(mode, sections, flags, prog=prog)
    ns, extra = parser.parse_known_args(_normalize(argv, flags))
    if extra:
        _reject(extra, [f.option for f in flags] + ["--config", "--help", "--verbose"], parser)
    given = vars(ns)
    values = {(f.section, f.key): given[f.option] for f in flags if f.option in given}
    layer = flags_layer(values, sections.defaults)
    resolved = resolve_config(
        env_cls, mode, config_path=ns.config, flags=layer, defaults=sections.defaults
    )
    resolved.verbose = bool(ns.verbose)
    return resolved


def _flags(models: dict[str, type[BaseModel]]) -> list[_Flag]:
    """Every flag: one per env field (a namespace field: one per its own fields), server field
    and manager field."""
    return [
        _Flag(section, key, _is_bool(info.annotation))
        for section, model in models.items()
        for key, info in model.model_fields.items()
        if not (section == "env" and key in models)
    ]


def _parser(
    mode: Mode, sections: FlagSections, flags: list[_Flag], *, prog: str | None = None
) -> argparse.ArgumentParser:
    """The parser of one mode; each flag's help is its field's description and default."""
    parser = _Parser(
        prog=prog,
        allow_abbrev=False,
        usage="%(prog)s [--config FILE] [--env.NAME VALUE ...] [--openai.NAME VALUE ...]"
        " [--slurm] [--testing] [--max_n_completions N] [--proxy_url URL] [--verbose]",
        description=f"{MODE_HELP[mode]}. Lowest to highest: defaults < config_init() <"
        " --config FILE < ATROPOS_ENV__NAME / ATROPOS_OPENAI__NAME / ATROPOS_NAME variables <"
        " flags. 'None' (or 'null') unsets an optional value.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file: env:, openai:, slurm:, ...")
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print the resolved configuration (the run writes it beside its outputs anyway)",
    )
    shown, models = sections.shown, sections.models
    titles = {
        "env": f"environment ({models['env'].__name__})",
        **{s: f"{s} ({m.__name__})" for s, m in models.items() if s not in ("env", "openai", "")},
        "openai": f"inference server ({models['openai'].__name__}; with --config, openai:"
        " may list several servers)",
        "": "server manager",
    }
    groups = {s: parser.add_argument_group(t) for s, t in titles.items()}
    for flag in flags:
        info = models[flag.section].model_fields[flag.key]
        text = (info.description or "").replace("%", "%%")
        default = shown[flag.section].get(flag.key, info.default)
        if "Secret" not in str(info.annotation):
            text += f" (default: {_show_value(default)})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": flag.option, "default": argparse.SUPPRESS, "help": text}
        if flag.boolean:
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        else:
            kwargs["metavar"] = _metavar(info.annotation)
        groups[flag.section].add_argument(flag.option, **kwargs)
    return parser


def show(env_cls: type, resolved: ResolvedConfig, *, verbose: bool = True) -> None:
    """Print the defaults chosen for the user (`resolved.notes`), then, when `verbose`, the
    resolved configuration (secrets removed), to stderr. Without it the runner names the file
    it writes the configuration to, in one line (`runner.save_config`)."""
    from rich.console import Console
    from rich.syntax import Syntax

    name = env_name(env_cls)
    for note in resolved.notes:  # first: which server and tokenizer nobody named
        print(f"{name} {resolved.mode}: {note}", file=sys.stderr, flush=True)
    if not verbose:
        return
    console = Console(stderr=True)
    console.rule(f"{name} {resolved.mode}")
    text = yaml.safe_dump(resolved.redacted(), sort_keys=False)
    console.print(Syntax(text, "yaml", background_color="default"))


def _normalize(argv: Sequence[str], flags: list[_Flag]) -> list[str]:
    """Accept kebab case (`--env.group-size`), and bind `--flag VALUE` as `--flag=VALUE` so a
    value that starts with '-' (`--env.max_num_workers -1`) is never taken for a flag."""
    takes_value = {f.option for f in flags if not f.boolean} | {"--config"}
    known = {f.option for f in flags} | {"--config", "--help", "-h", "--verbose", "-v"}
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        name, eq, value = _canonical(args[i]).partition("=")
        if name == "--":
            return out + args[i:]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if not eq and name in takes_value and nxt is not None and _canonical(nxt) not in known:
            out.append(f"{name}={nxt}")
            i += 2
            continue
        out.append(name + eq + value)
        i += 1
    return out


SHORT_FLAGS = {"--eval_every": "--env.eval_every"}
"""Flags of the run rather than of an environment's data, also taken without `--env.`:
`atropos env serve NAME --eval-every 10`."""


def _canonical(token: str) -> str:
    """`--env.group-size=x` -> `--env.group_size=x` (only the flag's name changes; a short
    flag becomes its long name)."""
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    name = "--" + name[2:].replace("-", "_")
    return SHORT_FLAGS.get(name, name) + eq + value


def _reject(extra: list[str], options: list[str], parser: argparse.ArgumentParser) -> NoReturn:
    first = next((t for t in extra if t.startswith("-")), None)
    see = f"(see: {parser.prog} --help)"
    if first is None:
        raise ConfigError(
            f"unexpected argument {extra[0]!r}: flags look like --env.NAME VALUE {see}"
        )
    name = first.partition("=")[0]
    raise ConfigError(f"unknown flag {name}{did_you_mean(name, options)} {see}")


def _show_value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    return "None" if value is None else repr(value) if value == "" else str(value)


def _is_bool(annotation: Any) -> bool:
    members = union_members(annotation)
    return bool in members and all(a in (bool, type(None)) for a in members)


def _metavar(annotation: Any) -> str:
    members = [a for a in union_members(annotation) if a is not type(None)]
    if len(members) != 1:
        return "VALUE"
    kind = members[0]
    if typing.get_origin(kind) is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(kind)) + "}"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "{" + ",".join(str(m.value) for m in kind) + "}"
    if "Secret" in str(kind):
        return "SECRET"
    names = {int: "INT", float: "FLOAT", str: "TEXT", bool: "BOOL"}
    return names.get(kind, "YAML")
