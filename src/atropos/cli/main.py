"""The `atropos` entry point: `atropos NOUN VERB [flags]`."""

from __future__ import annotations

import argparse
import sys

from atropos import __version__
from atropos.cli import api


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atropos", description=__doc__)
    p.add_argument("--version", action="version", version=f"atropos {__version__}")
    nouns = p.add_subparsers(dest="noun", metavar="COMMAND", required=True)

    api_p = nouns.add_parser("api", help="the trajectory API")
    api_verbs = api_p.add_subparsers(dest="verb", metavar="VERB", required=True)
    serve_p = api_verbs.add_parser("serve", help="run the trajectory API")
    api.add_serve_arguments(serve_p)
    serve_p.set_defaults(run=api.serve)

    demo_p = nouns.add_parser("demo", help="the main job on embedded defaults")
    demo_p.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    demo_p.set_defaults(run=_demo)
    return p


def _demo(args: argparse.Namespace) -> int:
    from atropos.demo import run

    return run(port=args.port)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.run(args))
