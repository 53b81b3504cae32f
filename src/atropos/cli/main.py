"""The `atropos` entry point: `atropos NOUN VERB [flags]`.

Every command's usage errors are one line on stderr and exit status 2: an unknown flag or
command names the nearest known one (`atropos.cli.argtypes.Parser`), and a value that breaks
a rule names the flag as typed (`atropos.envs.layering.validation_lines`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from atropos import __version__
from atropos.cli import api, local
from atropos.cli.argtypes import Parser


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="atropos",
        description="Atropos: environments, a trajectory API, a local inference server and a"
        " trainer for RL of language models. `atropos COMMAND --help` lists a command's flags.",
    )
    p.add_argument("--version", action="version", version=f"atropos {__version__}")
    nouns = p.add_subparsers(dest="noun", metavar="COMMAND", required=True)

    api_p = nouns.add_parser("api", help="the trajectory API")
    api_verbs = api_p.add_subparsers(dest="verb", metavar="VERB", required=True)
    serve_p = api_verbs.add_parser("serve", help="run the trajectory API")
    api.add_serve_arguments(serve_p)
    serve_p.set_defaults(run=api.serve)

    _add_env_noun(nouns)

    local_p = nouns.add_parser("local", help="a local inference server over transformers")
    local_verbs = local_p.add_subparsers(dest="verb", metavar="VERB", required=True)
    local_serve_p = local_verbs.add_parser(
        "serve", help="serve a HF model directory with OpenAI/vLLM endpoints"
    )
    local.add_serve_arguments(local_serve_p)
    local_serve_p.set_defaults(run=local.serve)

    for noun, text in _DELEGATED.items():  # commands with their own parser (`atropos.cli.NOUN`)
        noun_p = nouns.add_parser(noun, help=text, add_help=False)
        noun_p.add_argument("flags", nargs=argparse.REMAINDER)
        noun_p.set_defaults(run=_delegate(f"atropos.cli.{noun}"))

    _demo_parser(nouns)
    return p


def _demo_parser(nouns: argparse._SubParsersAction[Parser]) -> None:
    """`atropos demo`'s flags."""
    demo_p = nouns.add_parser(
        "demo", help="a tiny model learning by RL on this machine (API, server, env, trainer)"
    )
    demo_p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    demo_p.add_argument("--steps", type=int, default=None, help="trainer steps")
    demo_p.add_argument("--seed", type=int, default=0)
    demo_p.add_argument("--smoke", action="store_true", help="API-only smoke run (seconds)")
    demo_p.add_argument("--port", type=int, default=0, help="API port of --smoke")
    demo_p.add_argument(
        "--distill",
        action="store_true",
        help="on-policy distillation of the warm start toward an RL-trained teacher (no reward)",
    )
    demo_p.add_argument(
        "--teacher", default="", help="--distill's teacher checkpoint (default: trained first)"
    )
    demo_p.add_argument(
        "--teacher-steps", type=int, default=100, help="RL steps of that teacher (default 100)"
    )
    demo_p.add_argument(
        "--server",
        choices=("local", "vllm"),
        default="local",
        help="the inference server: ours (default) or vLLM itself (docs/inference.md)",
    )
    demo_p.add_argument(
        "--vllm-python",
        default="",
        help="--server vllm: a Python with vLLM installed (default: $ATROPOS_VLLM_PYTHON, this"
        " one, or the checkout's .cache/vllm-venv)",
    )
    demo_p.set_defaults(run=_demo)


_DELEGATED = {  # nouns with their own parser (train's: TrainConfig, read by pydantic-settings)
    "train": "the reference GRPO trainer (atropos train --help)",
    "export": "SFT or DPO data from rollouts (atropos export sft|dpo --help)",
    "view": "one self-contained HTML page of rollouts (atropos view --help)",
    "launch": "a whole run from one YAML file: local, Ray or Slurm (atropos launch --help)",
    "proxy": "OpenAI/Anthropic-compatible endpoints that record agents' tokens (atropos proxy"
    " serve --help)",
    "sandbox": "local images for sandboxes, never pulled (atropos sandbox image build --help)",
}

# (atropos.envs.cli.MODE_HELP says the same; not imported here, to keep `atropos api` fast)
_ENV_VERBS = {
    "serve": "send scored rollouts to the trajectory API (training)",
    "process": "write scored rollout groups to a JSONL file (no trainer needed)",
    "evaluate": "run the environment's evaluation once",
}


def _add_env_noun(nouns: argparse._SubParsersAction[Parser]) -> None:
    env_p = nouns.add_parser("env", help="environments: serve, process, evaluate, list, new")
    env_verbs = env_p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for mode, text in _ENV_VERBS.items():
        verb_p = env_verbs.add_parser(mode, help=text, description=f"{text}.")
        verb_p.add_argument("name", help="an id from `atropos env list`, or package.module:Class")
        verb_p.add_argument(
            "flags", nargs=argparse.REMAINDER, help="--env.*, --openai.*, ... (NAME --help)"
        )
        verb_p.set_defaults(run=_env_run)
    list_p = env_verbs.add_parser(
        "list",
        help="installed environments, where each comes from, and what it does",
        description="Installed environments: name, origin (built in, the package and version"
        " that installed it, or registered) and description. A broken plugin is listed with"
        " its error.",
    )
    list_p.set_defaults(run=_env_list)
    _add_publish(env_verbs)
    new_p = env_verbs.add_parser(
        "new",
        help="write an installable package for a new environment",
        description="Write DIR/NAME/: a package with the environment NAME (module NAME with '-'"
        " made '_'), its entry point, a small dataset, tests against the fake inference"
        " server, and a README. It prints the command that installs the package into this"
        " Python (`PYTHON -m pip install -e '.[test]'`) and runs its tests.",
    )
    new_p.add_argument("name", help="letters, digits, '-' and '_', starting with a letter")
    new_p.add_argument(
        "--dir", default=".", metavar="PATH", help="where to make the folder (default: here)"
    )
    new_p.add_argument(
        "--force", action="store_true", help="overwrite the package's files in an existing folder"
    )
    new_p.set_defaults(run=_env_new)


def _add_publish(env_verbs: argparse._SubParsersAction[Parser]) -> None:
    pub_p = env_verbs.add_parser(
        "publish",
        help="serve an environment in another framework's protocol (ORS, OpenEnv)",
        description="Serve the environment NAME over the Open Reward Standard (--as ors) or"
        " OpenEnv (--as openenv) until Ctrl-C, configured by its usual flags (--env.*,"
        " ...). Beyond loopback it needs --api-key (or $ATROPOS_API_KEY). Details:"
        " docs/ecosystem.md.",
    )
    _publish_options(pub_p)
    pub_p.add_argument("name", help="an id from `atropos env list`, or package.module:Class")
    pub_p.add_argument("flags", nargs=argparse.REMAINDER, help="--env.* (NAME --help)")
    pub_p.set_defaults(run=_env_publish)


def _publish_options(parser: argparse.ArgumentParser) -> None:
    """`--as`, `--host`, `--port`: before or after NAME (after it, taken from its flags)."""
    parser.add_argument("--as", dest="protocol", choices=("ors", "openenv"))
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")


def _env_publish(args: argparse.Namespace) -> int:
    from atropos import interop

    prog = f"atropos env publish {args.name}"
    own = argparse.ArgumentParser(prog=prog, add_help=False)
    _publish_options(own)
    ours, rest = own.parse_known_args(list(args.flags), argparse.Namespace(**vars(args)))
    if ours.protocol is None:
        print(f"{prog}: error: --as ors or --as openenv is required", file=sys.stderr)
        return 2
    try:
        interop.publish(ours.protocol, args.name, rest, ours.host, ours.port)
    except (LookupError, ValueError, ImportError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _env_run(args: argparse.Namespace) -> int:
    from atropos.envs import registry
    from atropos.envs.cli import run_mode

    prog = f"atropos env {args.verb} {args.name}"
    try:
        env_cls = registry.get(args.name)
    except registry.EnvNotFound as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (ImportError, TypeError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    if CHECK_FLAG in args.flags:
        return _env_check(env_cls, args.verb, [f for f in args.flags if f != CHECK_FLAG], prog)
    return run_mode(env_cls, args.verb, args.flags, prog=prog)


CHECK_FLAG = "--check-args"  # `atropos env serve NAME ... --check-args` (argtypes.CHECK_ARGS_HELP)


def _env_check(env_cls: type, mode: str, flags: list[str], prog: str) -> int:
    """`--check-args`: resolve the configuration as `run_mode` does and exit, running nothing:
    0, or 2 with the usage error (`atropos launch` checks its environments so)."""
    from atropos.envs.cli import parse
    from atropos.envs.config import ConfigError
    from atropos.envs.layering import env_name
    from atropos.envs.registry import missing_extras

    try:
        parse(env_cls, mode, flags, prog=prog)  # type: ignore[arg-type]
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    name = env_name(env_cls)
    problem = missing_extras(env_cls, name)
    if problem is None and mode != "evaluate" and getattr(env_cls, "evaluation_only", False):
        problem = f"{name} is an evaluation-only environment; use `atropos env evaluate {name}`"
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    return 0


def _env_list(args: argparse.Namespace) -> int:
    """A table of the environments (name, origin, description), then a line for each plugin
    whose entry points cannot be read; exit 0 whatever is broken."""
    from atropos.envs import registry

    known = registry.specs()
    if not known:
        print(
            "no environments installed (`atropos env new NAME` writes a package for one; or"
            " register one with atropos.envs.registry.register or an entry point in group"
            f" {registry.ENTRY_POINT_GROUP!r})"
        )
    rows = [("NAME", "SOURCE", "ORIGIN", "DESCRIPTION")] if known else []
    rows += [
        (n, known[n].source, known[n].origin, registry.describe(n, known[n])) for n in sorted(known)
    ]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    for row in rows:
        cells = [f"{cell:<{width}}" for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]).rstrip())
    for line in registry.unreadable_plugins():
        print(f"(not listed: {line})")
    return 0


def _env_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    from atropos.envs.scaffold import ScaffoldError, package_names, write_package
    from atropos.envs.scaffold_files import next_step

    prog = "atropos env new"
    try:
        package_names(args.name)
    except ScaffoldError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        written = write_package(args.name, Path(args.dir), force=args.force)
    except (ScaffoldError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    root = Path(args.dir) / args.name
    print(f"wrote the environment package {root}:")
    for path in written:
        print(f"  {path.relative_to(root).as_posix()}")
    print(f"next: {next_step(root)}")
    return 0


def _delegate(module: str) -> Callable[[argparse.Namespace], int]:
    """Hand the remaining arguments to `module.main(argv)` (a command with its own parser)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(importlib.import_module(module).main(args.flags))

    return run


def _demo(args: argparse.Namespace) -> int:
    if args.smoke:
        from atropos.demo.smoke import run as smoke

        return smoke(port=args.port)
    from pathlib import Path

    from atropos.demo.procs import ServiceError
    from atropos.demo.run import DemoConfig, run

    cfg = DemoConfig(out=Path(args.out), seed=args.seed)
    cfg.server, cfg.vllm_python = args.server, args.vllm_python
    if cfg.server == "vllm":
        from atropos.engines import VllmNotFound, find_vllm_python

        try:
            find_vllm_python(cfg.vllm_python)
        except VllmNotFound as err:
            print(f"atropos demo: error: {err}", file=sys.stderr)
            return 2
    cfg.teacher, cfg.teacher_steps = args.teacher, args.teacher_steps
    if args.teacher and not Path(args.teacher, "config.json").is_file():
        print(
            f"atropos demo: error: --teacher {args.teacher}: no checkpoint there", file=sys.stderr
        )
        return 2
    if args.steps is not None:
        cfg.steps = args.steps
    try:
        if args.distill:
            from atropos.demo.distill import run_distill

            run_distill(cfg)
        else:
            run(cfg)
    except (ServiceError, TimeoutError) as err:
        print(f"atropos demo: error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        # Bare `atropos` asks what the tool does, which is not a mistake: the help (each command
        # with one line) on stdout and exit 0, as pip, docker and kubectl do (git exits 1).
        build_parser().print_help()
        return 0
    try:
        if argv[0] in _DELEGATED:  # their own parsers, --help included
            return _delegate(f"atropos.cli.{argv[0]}")(argparse.Namespace(flags=argv[1:]))
        args = build_parser().parse_args(argv)
        return int(args.run(args))
    except BrokenPipeError:  # `atropos env list | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
