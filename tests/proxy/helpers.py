"""Shared scaffolding of the proxy tests: a proxy over a server whose token answers are recorded
(to compare a trajectory with what the server itself returned)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.managed import ManagedServer
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.proxy.app import Proxy, ProxySettings


class Recording:
    """A token server that keeps what the real one returned (ids and logprobs), per call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.outputs: list[tuple[list[int], list[float]]] = []
        servers = getattr(inner, "servers", None)  # a ServerManager: its (first) backend, which
        self.backend = servers[0] if servers else None  # the session asks for its context length

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        prompt, outs, lps, finishes = await self.inner.tokens_and_logprobs_completion(**kwargs)
        self.outputs += [(list(o), list(lp)) for o, lp in zip(outs, lps, strict=True)]
        return prompt, outs, lps, finishes


class RecordingManager:
    """`managed_server()` over a recording token server (everything else: the manager's)."""

    def __init__(self, manager: ServerManager) -> None:
        self.manager = manager
        self.recording = Recording(manager)

    def managed_server(self, tokenizer: Any) -> Any:
        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[ManagedServer]:
            yield ManagedServer(self.recording, tokenizer)

        return session()

    async def chat_completion(self, **kwargs: Any) -> Any:
        return await self.manager.chat_completion(**kwargs)


def make_proxy(base_url: str, server_type: str = "vllm", **settings: Any) -> Proxy:
    config = APIServerConfig(base_url=base_url, server_type=server_type, model_name="atropos-tiny")
    manager = ServerManager([config], ServerManagerConfig())
    tokenizer = load_tokenizer("tiny")
    server: Any = manager if server_type == "openai" else RecordingManager(manager)
    kwargs = {"model": "atropos-tiny", **settings}
    return Proxy(server, tokenizer, ProxySettings(**kwargs), text_only=server_type == "openai")
