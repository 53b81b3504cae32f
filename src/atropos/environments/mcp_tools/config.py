"""`mcp_tools`' settings: the MCP servers to start, the task set, turns, timeouts and scoring.

The servers are a list, written the same in YAML (`env: servers: [...]` in a `--config` file)
and on the command line (`--env.servers '[{"name": "calc", "command": "calc-mcp"}]'`):

```yaml
env:
  servers:
    - name: files
      command: npx
      args: ["-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
    - name: calc
      command: python
      args: ["-m", "my_calc_server"]
      env: {CALC_PRECISION: "6"}
      cwd: /opt/calc
      instances: 4
      concurrent: false
```
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from atropos.envs.config import BaseEnvConfig

__all__ = ["FIXTURE_MODULE", "MCPServerSpec", "MCPToolsConfig", "fixture_server"]

FIXTURE_MODULE = "atropos.environments.mcp_tools.fixture_server"


class MCPServerSpec(BaseModel):
    """One MCP server, started as a child process speaking MCP over its stdin and stdout."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$",
        description="what errors and prefixed tool names (NAME__TOOL) call it",
    )
    command: str = Field(min_length=1, description="the program to run (found on PATH)")
    args: list[str] = Field(default_factory=list, description="its arguments")
    env: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="environment variables set for it, over the base (secrets: never printed"
        " or saved with the run's config)",
    )
    cwd: str | None = Field(default=None, description="its working directory (unset: ours)")
    inherit_env: bool = Field(
        default=False,
        description="start from this process's whole environment (default: only HOME, PATH,"
        " SHELL, TERM, USER and LOGNAME, so API keys stay here)",
    )
    instances: int = Field(
        default=1, ge=1, le=64, description="processes of this server to start and share calls"
    )
    concurrent: bool = Field(
        default=True,
        description="one process may take several calls at once (false: one call at a time"
        " each, the others waiting for a free instance)",
    )
    protocol: Literal["auto", "legacy"] = Field(
        default="auto",
        description="auto: ask for the newest MCP revision, falling back to the initialize"
        " handshake; legacy: the initialize handshake only",
    )


def fixture_server() -> MCPServerSpec:
    """The shipped fixture server (`python -m atropos.environments.mcp_tools.fixture_server`),
    run by this interpreter with this copy of the package on its path."""
    source = Path(__file__).resolve().parents[3]  # the directory holding the `atropos` package
    return MCPServerSpec(
        name="fixture",
        command=sys.executable,
        args=["-m", FIXTURE_MODULE],
        env={"PYTHONPATH": SecretStr(str(source))},
    )


class MCPToolsConfig(BaseEnvConfig):
    """`mcp_tools`' settings."""

    servers: list[MCPServerSpec] = Field(
        default_factory=lambda: [fixture_server()],
        min_length=1,
        description="the MCP servers to start (default: the shipped fixture server)",
    )
    dataset_name: str | None = Field(
        default=None,
        description="the tasks: a JSONL file, a directory of train.jsonl/test.jsonl, or a hub"
        " dataset (unset: the shipped tasks for the fixture server)",
    )
    max_turns: int = Field(default=6, ge=1, description="policy replies per episode at most")
    max_gen_per_turn: int = Field(default=512, ge=1, description="token limit of one reply")
    start_timeout: float = Field(
        default=30.0, gt=0, description="seconds for a server to start and list its tools"
    )
    call_timeout: float = Field(default=30.0, gt=0, description="seconds for one tool call")
    server_restarts: int = Field(
        default=3, ge=0, description="times a server's processes are started again after dying"
    )
    stop_grace: float = Field(
        default=2.0, gt=0, description="seconds a server gets to exit at each step of its stop"
    )
    prefix_tools: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="offer tools as SERVER__TOOL: auto (names two servers share), always,"
        " never (a shared name is an error)",
    )
    tool_schemas: Literal["template", "system"] = Field(
        default="template",
        description="where the tool schemas go: the chat template's `tools` (system when the"
        " template ignores them) or a <tools> block in the system prompt",
    )
    max_calls_per_turn: int = Field(
        default=8, ge=1, description="calls one reply may make (the rest get an error)"
    )
    max_result_chars: int = Field(
        default=2000, ge=16, description="characters of a tool result shown to the policy"
    )
    call_credit: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="weight of the expected-calls credit in the score (0: the answer only)",
    )
    temperature: float = Field(default=0.8, ge=0, description="sampling temperature (training)")
    eval_limit: int = Field(default=0, ge=0, description="held-out tasks per evaluation (0: all)")
