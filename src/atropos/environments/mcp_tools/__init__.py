"""`mcp_tools`: multi-turn tool use against real MCP servers named by the config.

The environment starts the MCP servers its config names (stdio), or connects to ones already
running (HTTP), with the `mcp` package (the `mcp` extra); lists their tools and offers them to
the policy; runs the calls the policy makes against the servers, feeds the results back as
masked tool turns (token-exact through `ManagedServer.chat_turn`) and scores the final answer
against the task's gold, with optional credit for the expected calls. Details:
docs/mcp_tools.md.

Modules: `config` (settings, server specs), `transport` (a server as a child process),
`http_transport` (a server at a URL), `servers` (starting, calling and stopping them), `tasks`
(the task set and the reward rules), `env` (the environment and its rollout loop),
`fixture_server` (the shipped MCP server), `demo` (an offline stand-in policy). This package
imports none of them until asked, so the fixture server (`python -m
atropos.environments.mcp_tools.fixture_server`) starts quickly.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "MCPServerSpec",
    "MCPTools",
    "MCPToolsConfig",
    "Task",
    "ToolServerError",
    "ToolServers",
    "demo_responder",
    "load_tasks",
]

_WHERE = {
    "MCPServerSpec": "config",
    "MCPToolsConfig": "config",
    "MCPTools": "env",
    "Task": "tasks",
    "load_tasks": "tasks",
    "ToolServerError": "servers",
    "ToolServers": "servers",
    "demo_responder": "demo",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
