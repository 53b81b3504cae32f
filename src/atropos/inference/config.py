"""Configuration of inference servers, with atroposlib 0.4.0's field names and defaults.

`ServerBaseline` describes servers to discover (Slurm or the local default ports);
`APIServerConfig` is one server at a known `base_url`; `ServerManagerConfig` tunes the manager.
`local_server_config()` is the local CPU server with the tiny policy: the built-in
environments' default, and any environment's when it names no server.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ServerType = Literal["openai", "vllm", "sglang", "trl"]


class ServerBaseline(BaseModel):
    """Settings shared by every server (upstream's `ServerBaseline`)."""

    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(1200, description="seconds before one request gives up")
    num_max_requests_at_once: int = Field(512, description="training requests in flight per server")
    num_requests_for_eval: int = Field(64, description="evaluation requests in flight per server")
    model_name: str = Field("default", description="model name sent with every request")
    rolling_buffer_length: int = Field(1000, description="samples kept for latency metrics")
    server_type: ServerType = Field("openai", description="openai | vllm | sglang | trl")
    tokenizer_name: str = Field("none", description="tokenizer to load ('none': model_name)")
    vllm_token_api: Literal["completions", "generate"] = Field(
        "completions",
        description="vllm token ids via /v1/completions (return_token_ids) or upstream's /generate",
    )


class APIServerConfig(ServerBaseline):
    """One server at a known address (upstream's `APIServerConfig`)."""

    api_key: SecretStr = Field(SecretStr(""), description="bearer key for the server")
    base_url: str = Field("", description="e.g. http://127.0.0.1:9004/v1")
    n_kwarg_is_ignored: bool = Field(False, description="the server ignores n: fan out instead")
    health_check: bool = Field(True, description="probe /health (never spends tokens)")


class ServerManagerConfig(BaseModel):
    """How requests are spread over servers (upstream's `ServerManagerConfig`, all wired)."""

    model_config = ConfigDict(extra="forbid")

    slurm: bool = Field(False, description="discover inference nodes from SLURM_JOB_NODELIST")
    testing: bool = Field(False, description="use the in-package fake inference server")
    max_n_completions: int = Field(8, description="requests asking for more n are split")
    proxy_url: str | None = Field(None, description="ManagedServer proxy (ATROPOS_PROXY_URL)")
    max_attempts: int = Field(3, ge=1, description="attempts per call, across servers")
    retry_backoff: float = Field(0.5, ge=0, description="first retry waits up to this (s)")
    retry_backoff_max: float = Field(10.0, ge=0, description="longest retry wait (s)")
    deadline: float | None = Field(
        None, gt=0, description="seconds one call may take in all (None: the server timeout)"
    )
    server_wait: float | None = Field(
        None,
        gt=0,
        description="seconds every server of a role (policy, teacher, judge) may be unreachable"
        " in a row before calls fail and the run stops (None: 60, or 300 in serve mode)",
    )
    health_check_interval: float = Field(5.0, gt=0, description="seconds between probes")
    health_check_timeout: float = Field(5.0, gt=0, description="seconds one probe may take")
    routing: Literal["sticky_least_loaded", "least_loaded"] = Field(
        "sticky_least_loaded",
        description="sessions (ManagedServer, proxy, agents): keep a conversation on the server"
        " that served its first turn, or send every call to the least-loaded server",
    )
    rehome_load_ratio: float = Field(
        2.0,
        ge=1.0,
        description="a session leaves its server when it is over this many times as loaded as"
        " the least-loaded one (docs/inference.md, Sessions)",
    )
    adaptive_concurrency: bool = Field(
        False,
        description="per server, grow the in-flight cap while it keeps up and shrink it when it"
        " queues (its /metrics, else latency), between adaptive_floor and the configured max",
    )
    adaptive_floor: int = Field(4, ge=1, description="the adaptive in-flight cap's lowest value")
    adaptive_interval: float = Field(
        1.0, gt=0, description="seconds between adaptive in-flight cap decisions"
    )


LOCAL_SERVER_URL = "http://127.0.0.1:9001/v1"  # `atropos local serve`'s default address
LOCAL_MODEL_NAME = "atropos-tiny"  # the tiny policy's name as docs/demo-policy.md serves it
# Prompt plus output tokens `atropos local serve tiny` allows: room for prompts longer than the
# 128 positions the tiny policy was trained on (past them its answers are noise, not errors).
LOCAL_MAX_MODEL_LEN = 4096


def local_server_config(server_type: ServerType = "vllm") -> APIServerConfig:
    """The local CPU server at its default address, serving the tiny policy: the server of
    the built-in environments' `config_init` and of a new environment (`atropos local serve
    tiny`). `server_type` "openai" reads it as a text-only API.

    >>> server = local_server_config()
    >>> server.base_url, server.model_name, server.server_type
    ('http://127.0.0.1:9001/v1', 'atropos-tiny', 'vllm')
    """
    return APIServerConfig(
        base_url=LOCAL_SERVER_URL, server_type=server_type, model_name=LOCAL_MODEL_NAME
    )


def local_serve_command() -> str:
    """The command that starts `local_server_config()`'s server: `tiny` is the shipped tiny
    policy, served as LOCAL_MODEL_NAME on LOCAL_SERVER_URL's port with LOCAL_MAX_MODEL_LEN.

    >>> local_serve_command()
    'atropos local serve tiny'
    """
    return "atropos local serve tiny"
