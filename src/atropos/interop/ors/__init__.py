"""The Open Reward Standard (ORS, PyPI `openreward`) both ways: `env_class("ors:URL#ENV")` runs
a remote ORS environment as an Atropos environment (`consumer`), and `publish` serves one of
ours as an ORS server (`server`). The protocol's routes and shapes: `wire`; our client:
`client`. The mapping of concepts, and what does not map: docs/ecosystem.md.
"""

from __future__ import annotations

from atropos.interop.ors.consumer import ORSConfig, ORSEnv, env_class
from atropos.interop.ors.wire import ORSError

__all__ = ["ORSConfig", "ORSEnv", "ORSError", "env_class", "publish"]


def publish(env_name: str, env_argv: list[str], host: str, port: int) -> None:
    """Serve the registered environment `env_name` as an ORS server until SIGINT/SIGTERM."""
    from atropos.interop.ors.server import publish as serve

    serve(env_name, env_argv, host, port)
