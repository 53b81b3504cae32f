"""`atropos proxy serve`: the rollout proxy (docs/proxy.md).

Its own flags (address, key, tool-call parser, session limits) come first; everything else is
the inference servers' configuration, read exactly as an environment's is (`--openai.*`,
`--config FILE` with an `openai:` list, `ATROPOS_OPENAI__*` variables, `--slurm`, and
`--env.tokenizer_name` for the tokenizer): `atropos.envs.layering`. With no server named, the
local CPU server (`atropos local serve tiny`) is used, and the proxy says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from atropos.cli.api import add_access_arguments
from atropos.cli.argtypes import Parser, positive_int, positive_seconds, usage_error
from atropos.names import is_loopback

PROG = "atropos proxy serve"
KEY_VARIABLE = "ATROPOS_PROXY_API_KEY"


def build_parser() -> argparse.ArgumentParser:
    """The proxy's own flags (the servers' flags are the environments': see the epilog)."""
    from atropos.inference.tool_calls import PARSERS

    p = Parser(
        prog=PROG,
        allow_abbrev=False,
        description="An OpenAI- and Anthropic-compatible proxy in front of the policy that keeps"
        " every token an agent's calls generate, by session.",
        epilog="Inference servers are configured as for environments: --openai.base_url URL"
        " --openai.server_type vllm|sglang|openai --openai.model_name NAME, several in --config"
        " FILE (openai: [...]), ATROPOS_OPENAI__* variables; --env.tokenizer_name NAME for the"
        " tokenizer (default: the servers' model). See `atropos env serve NAME --help`.",
    )
    p.add_argument("verb", choices=["serve"], help="serve: run the proxy")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=9100, help="port (default %(default)s; 0: free)")
    add_access_arguments(p, KEY_VARIABLE, "/health")
    p.add_argument(
        "--tool-parser",
        choices=sorted(PARSERS),
        default="hermes",
        help="how tool calls are read from the model's text (default %(default)s)",
    )
    p.add_argument("--model", default=None, help="model name in answers (default: the servers')")
    p.add_argument("--max-turns", type=positive_int, default=256, help="calls per session")
    p.add_argument("--max-tokens", type=positive_int, default=262_144, help="tokens per session")
    p.add_argument(
        "--max-seconds", type=positive_seconds, default=3600.0, help="wall time per session"
    )
    p.add_argument(
        "--session-ttl",
        type=positive_seconds,
        default=3600.0,
        help="forget a session idle this long (default %(default)s s)",
    )
    p.add_argument("--max-sessions", type=positive_int, default=4096, help="open sessions")
    p.add_argument(
        "--max-body-mb", type=positive_seconds, default=8.0, help="largest request body (MiB)"
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check, build the servers, then serve until SIGINT/SIGTERM."""
    args, rest = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if not is_loopback(args.host, resolve=True) and not args.api_key and not args.insecure:
        usage_error(
            PROG,
            f"refusing to bind {args.host} without an API key: anyone who can reach it could"
            f" generate with your policy. Pass --api-key-file PATH (or set {KEY_VARIABLE}), or"
            " --insecure if this network is trusted.",
        )
    from atropos.envs.config import ConfigError
    from atropos.proxy.serve import ProxyServers, build_proxy

    try:
        from atropos.envs.cli import parse

        resolved = parse(ProxyServers, "serve", rest, prog=PROG)
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as stop:  # --help of the servers' flags
        return int(stop.code or 0)
    for note in resolved.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    return _serve(args, build_proxy(resolved, _settings(args)))


def _settings(args: argparse.Namespace) -> Any:
    from atropos.proxy.app import ProxySettings
    from atropos.proxy.session import Limits

    return ProxySettings(
        model=args.model or "",
        tool_parser=args.tool_parser,
        limits=Limits(args.max_turns, args.max_tokens, args.max_seconds),
        session_ttl=args.session_ttl,
        max_sessions=args.max_sessions,
        max_body_bytes=int(args.max_body_mb * 2**20),
        api_key=args.api_key or None,
        host=args.host,
    )


def _serve(args: argparse.Namespace, proxy: Any) -> int:
    from atropos.cli import listen
    from atropos.proxy.app import build_app

    sock = listen.bind(args.host, args.port, PROG)
    app = build_app(proxy)
    servers = ", ".join(proxy.describe_servers())
    key = " (api key required)" if proxy.settings.api_key else ""
    print(f"atropos proxy: {listen.base_url(sock)} -> {servers}{key}", flush=True)
    listen.serve(app, sock, args.log_level)
    return 0
