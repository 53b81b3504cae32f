"""`atropos api serve`: run the trajectory API.

A key never needs to be on the command line, where every user of the machine can read it
(`ps`, `/proc/PID/cmdline`): `--api-key-file PATH` or the environment variable carry it.
`--api-key KEY` still works, with a warning.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from atropos.api.app import ApiConfig, create_app
from atropos.cli import listen
from atropos.cli.argtypes import CHECK_ARGS_HELP, non_negative_int, usage_error
from atropos.names import is_loopback

__all__ = ["add_access_arguments", "add_serve_arguments", "config_from_args"]

log = logging.getLogger("atropos.api")


def add_serve_arguments(p: argparse.ArgumentParser, default_host: str = "127.0.0.1") -> None:
    """The flags of `atropos api serve` (shared with the `run-api` compatibility command)."""
    p.add_argument("--host", default=default_host, help="address to bind (default %(default)s)")
    p.add_argument(
        "--port", type=int, default=8000, help="port (default %(default)s; 0: any free port)"
    )
    p.add_argument(
        "--store",
        default=None,
        help="'sqlite:PATH' (durable, the default: RUN_DIR/api.db), 'sqlite-full:PATH'"
        " (fsync every commit) or 'memory' (lost on exit)",
    )
    p.add_argument("--run-dir", default="runs", help="where the default store lives")
    add_access_arguments(p, "ATROPOS_API_KEY", "/ and /health")
    p.add_argument(
        "--env-timeout",
        type=float,
        default=120.0,
        help="seconds an env may stay silent before its weight and minimum stop counting",
    )
    p.add_argument(
        "--max-staleness",
        type=non_negative_int,
        default=None,
        help="bound staleness to N steps: envs pace their rollouts to stay within it; groups"
        " still older at batch time are dropped and counted",
    )
    p.add_argument("--max-body-mb", type=float, default=256.0, help="largest body as sent")
    p.add_argument("--max-inflated-mb", type=float, default=256.0, help="largest gunzipped body")
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="allow this browser origin (repeatable; never with credentials)",
    )
    listen.add_allowed_host(p)
    p.add_argument(
        "--response-gzip",
        choices=["auto", "always", "never"],
        default="auto",
        help="gzip responses over 1000 bytes to clients that accept it: 'auto' (default) skips"
        " clients on this machine, where compressing costs more CPU than it saves",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    p.add_argument("--check-args", action="store_true", help=CHECK_ARGS_HELP)


class _KeyOnCommandLine(argparse.Action):
    """`--api-key KEY`: kept for compatibility, with a warning that the key is public."""

    def __init__(self, *args: Any, variable: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variable = variable

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, *_: Any
    ) -> None:
        print(
            f"{parser.prog}: warning: --api-key puts the key in `ps` and /proc/PID/cmdline,"
            f" readable by every user of this machine; use --api-key-file PATH or set"
            f" ${self.variable} instead",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


class _KeyFile(argparse.Action):
    """`--api-key-file PATH`: the key is the file's content (surrounding whitespace removed)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, *_: Any
    ) -> None:
        try:
            key = Path(values).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or str(err)
            parser.error(f"--api-key-file {values}: cannot read it ({why})")
        if not key:
            parser.error(f"--api-key-file {values}: the file is empty; write the key in it")
        namespace.api_key = key


def add_access_arguments(p: argparse.ArgumentParser, key_variable: str, open_paths: str) -> None:
    """`--api-key-file` or `--api-key` (default: the environment variable) and `--insecure`,
    for any server."""
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key-file",
        action=_KeyFile,
        metavar="PATH",
        help=f"require 'Authorization: Bearer KEY' on every endpoint but {open_paths}, with"
        f" KEY read from this file (or set ${key_variable})",
    )
    keys.add_argument(
        "--api-key",
        action=_KeyOnCommandLine,
        variable=key_variable,
        default=os.environ.get(key_variable),
        metavar="KEY",
        help=f"the key itself (default: ${key_variable}); visible to every user in `ps`:"
        " prefer --api-key-file or the variable",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding a non-loopback address without an API key",
    )


def config_from_args(args: argparse.Namespace, prog: str = "atropos api serve") -> ApiConfig:
    """Check the flags and turn them into an ApiConfig; a usage error (exit 2) on bad values."""
    if not is_loopback(args.host, resolve=True) and not args.api_key and not args.insecure:
        usage_error(
            prog,
            f"refusing to bind {args.host} without an API key: anyone who can reach it could"
            " read and wipe your data. Pass --api-key-file PATH (or set ATROPOS_API_KEY), or"
            " --insecure if this network is trusted.",
        )
    store = args.store or f"sqlite:{Path(args.run_dir) / 'api.db'}"
    return ApiConfig(
        store=store,
        api_key=args.api_key or None,
        host=args.host,
        allowed_hosts=list(args.allowed_host),
        env_timeout=args.env_timeout,
        max_staleness=args.max_staleness,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_inflated_bytes=int(args.max_inflated_mb * 2**20),
        cors_origins=list(args.cors_origin),
        response_gzip=args.response_gzip,
    )


def serve(args: argparse.Namespace, prog: str = "atropos api serve") -> int:
    """Run the API until interrupted: the port is bound before anything says it listens."""
    config = config_from_args(args, prog)
    if args.check_args:
        return 0
    sock = listen.bind(args.host, args.port, prog)
    try:
        app = create_app(config)
    except ValueError as err:
        sock.close()
        sys.exit(f"{prog}: error: {err}")
    print(
        f"atropos api: {listen.base_url(sock)} store={config.store}"
        f"{' (api key required)' if config.api_key else ''}",
        flush=True,
    )
    listen.serve(app, sock, args.log_level)
    return 0
