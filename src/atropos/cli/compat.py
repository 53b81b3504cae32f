"""Compatibility commands with atroposlib 0.4.0's names and flags (`run-api`)."""

from __future__ import annotations

from atropos.cli.api import add_serve_arguments, serve
from atropos.cli.argtypes import Parser


def run_api(argv: list[str] | None = None) -> int:
    """`run-api --host --port [--reload]`: our API under upstream's command.

    The default host is 127.0.0.1, not upstream's 0.0.0.0: binding every interface needs
    `--api-key` or `--insecure`.
    """
    p = Parser(prog="run-api", description="Run the Atropos trajectory API.")
    add_serve_arguments(p)
    p.add_argument("--reload", action="store_true", help="accepted for compatibility; ignored")
    return serve(p.parse_args(argv), "run-api")
