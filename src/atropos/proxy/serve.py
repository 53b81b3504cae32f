"""Building a proxy from an environment-style configuration, and serving it in-process.

`ProxyServers` is the stand-in environment whose configuration the proxy reads: the servers
(`--openai.*`, `openai:` in a file, variables) and `--env.tokenizer_name`, layered exactly as an
environment's (`atropos.envs.layering`). `build_proxy` turns that into a `Proxy`;
`serving(proxy)` runs its app on 127.0.0.1 inside the running event loop (the loop that owns
the `ServerManager`), which is how an environment embeds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.config import ResolvedConfig
from atropos.proxy.app import Proxy, ProxySettings, build_app

__all__ = ["ProxyServers", "build_proxy", "serving"]


class ProxyServers(BaseEnv):
    """The configuration the proxy reads its servers from (never run as an environment)."""

    name = "proxy"

    async def get_next_item(self) -> Any:  # pragma: no cover - never run
        raise NotImplementedError("ProxyServers only carries the proxy's server configuration")

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError("ProxyServers only carries the proxy's server configuration")


def build_proxy(resolved: ResolvedConfig, settings: ProxySettings) -> Proxy:
    """A `Proxy` over the resolved servers, with their tokenizer; `settings.model` defaults to
    the first server's model name."""
    from atropos.inference.config import APIServerConfig
    from atropos.inference.manager import ServerManager
    from atropos.inference.reasoning import Reasoning
    from atropos.inference.tokenizer import load_tokenizer

    servers = resolved.servers
    configs = servers if isinstance(servers, list) else []
    if not settings.model:
        first = configs[0].model_name if configs else "atropos-policy"
        settings.model = first or "atropos-policy"
    text_only = bool(configs) and all(
        isinstance(c, APIServerConfig) and c.server_type == "openai" for c in configs
    )
    tokenizer = load_tokenizer(resolved.env.tokenizer_name)
    reasoning = Reasoning.of(resolved.env)  # --env.thinking_mode, reasoning_effort, ...
    manager = ServerManager(servers, resolved.manager, tokenizer=tokenizer, reasoning=reasoning)
    return Proxy(manager, tokenizer, settings, text_only=text_only, server_configs=configs)


def _embedded_server(config: Any) -> Any:
    """A uvicorn server that leaves the host process's signal handlers alone."""
    import uvicorn

    class Embedded(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the environment's runner owns SIGINT/SIGTERM

    return Embedded(config)


@contextlib.asynccontextmanager
async def serving(proxy: Proxy, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `proxy` in the running loop; yields its base URL; stops it on exit (the sessions
    stay with `proxy`)."""
    from atropos.http.serve import uvicorn_config
    from atropos.net import free_port

    port = port or free_port()
    config = uvicorn_config(build_app(proxy), host=host, port=port, lifespan="on")
    server = _embedded_server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"the proxy on {host}:{port} stopped while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the proxy on {host}:{port} did not start within 30 s")
            await asyncio.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10)
