"""`mcp_tools`' settings: the MCP servers to start or reach, the task set, turns, timeouts and
scoring.

The servers are a list, written the same in YAML (`env: servers: [...]` in a `--config` file)
and on the command line (`--env.servers '[{"name": "calc", "command": "calc-mcp"}]'`). A server
with `command` is started by us as a child process and spoken to over stdio; one with `url` is
already running and is reached over HTTP (streamable HTTP, or the legacy HTTP+SSE transport),
with `headers` (secrets, like `env`):

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
    - name: search
      url: https://mcp.example.com/mcp
      headers: {Authorization: "Bearer sk-search-123"}  # a literal: configs do not expand $VARS
```
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from atropos.envs.config import BaseEnvConfig
from atropos.envs.limits import ToolLimitsConfig

__all__ = ["FIXTURE_MODULE", "MCPServerSpec", "MCPToolsConfig", "fixture_server"]

FIXTURE_MODULE = "atropos.environments.mcp_tools.fixture_server"


_STDIO_ONLY = ("args", "env", "cwd", "inherit_env")  # what only a server we start takes


class MCPServerSpec(BaseModel):
    """One MCP server: started as a child process speaking MCP over its stdin and stdout
    (`command`), or already running and reached over HTTP (`url`); exactly one of the two."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$",
        description="what errors and prefixed tool names (NAME__TOOL) call it",
    )
    command: str | None = Field(
        default=None, min_length=1, description="the program to run (found on PATH; stdio)"
    )
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
    url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="the endpoint of an MCP server already running, reached over HTTP (e.g."
        " http://127.0.0.1:8000/mcp)",
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="HTTP headers sent with every request to `url`, e.g. Authorization"
        " (secrets: never printed or saved with the run's config)",
    )
    transport: Literal["auto", "streamable-http", "sse"] = Field(
        default="auto",
        description="how `url` speaks MCP: auto and streamable-http (the current transport),"
        " sse (the legacy HTTP+SSE one)",
    )
    instances: int = Field(
        default=1,
        ge=1,
        le=64,
        description="processes of this server to start (a `url` server: sessions to open)"
        " and share calls",
    )
    concurrent: bool = Field(
        default=True,
        description="one process (or session) may take several calls at once (false: one"
        " call at a time each, the others waiting for a free instance)",
    )
    protocol: Literal["auto", "legacy"] = Field(
        default="auto",
        description="auto: ask for the newest MCP revision, falling back to the initialize"
        " handshake; legacy: the initialize handshake only",
    )

    @model_validator(mode="after")
    def _command_or_url(self) -> MCPServerSpec:
        """Exactly one of `command` and `url`, and only the fields that kind of server takes."""
        kind = "give `command` (a program we start, spoken to over stdio) or `url` (a server"
        kind += " already running, reached over HTTP)"
        if self.command is None and self.url is None:
            raise ValueError(f"MCP server {self.name!r}: {kind}")
        if self.command is not None and self.url is not None:
            raise ValueError(f"MCP server {self.name!r}: {kind}, not both")
        if self.url is not None:
            given = [field for field in _STDIO_ONLY if getattr(self, field) != _DEFAULTS[field]]
            if given:
                raise ValueError(
                    f"MCP server {self.name!r} has a `url`: {', '.join(given)} are for a server"
                    " we start (`command`); a `url` server takes `headers` and `transport`"
                )
        elif self.headers or self.transport != "auto":
            raise ValueError(
                f"MCP server {self.name!r} has a `command`: `headers` and `transport` are for a"
                " server reached over HTTP (`url`); give the program its settings in `args`"
                " or `env`"
            )
        return self

    @property
    def where(self) -> str:
        """What errors show of it: its command line, or its URL (without any user:password)."""
        if self.url is not None:
            return _without_userinfo(self.url)
        return " ".join([self.command or "", *self.args])


_DEFAULTS: dict[str, object] = {"args": [], "env": {}, "cwd": None, "inherit_env": False}


def _without_userinfo(url: str) -> str:
    """`url` with any `user:password@` dropped (a secret, perhaps).

    >>> _without_userinfo("https://me:s3cret@example.com:8443/mcp?x=1")
    'https://example.com:8443/mcp?x=1'
    """
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


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


class MCPToolsConfig(BaseEnvConfig, ToolLimitsConfig):
    """`mcp_tools`' settings."""

    servers: list[MCPServerSpec] = Field(
        default_factory=lambda: [fixture_server()],
        min_length=1,
        description="the MCP servers to start or reach (default: the shipped fixture server)",
    )
    dataset_name: str | None = Field(
        default=None,
        description="the tasks: a JSONL file, a directory of train.jsonl/test.jsonl, or a hub"
        " dataset (unset: the shipped tasks for the fixture server)",
    )
    max_turns: int = Field(default=6, ge=1, description="policy replies per episode at most")
    max_gen_per_turn: int = Field(default=512, ge=1, description="token limit of one reply")
    start_timeout: float = Field(
        default=30.0,
        gt=0,
        description="seconds for a server to start (or be reached) and list its tools",
    )
    call_timeout: float = Field(default=30.0, gt=0, description="seconds for one tool call")
    server_restarts: int = Field(
        default=3,
        ge=0,
        description="times a server's processes are started again after dying (a `url`"
        " server: sessions opened again after losing theirs)",
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
