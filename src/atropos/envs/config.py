"""Environment configuration: `BaseEnvConfig` (upstream's fields and defaults) and the
`ResolvedConfig` every run mode receives; the layering that builds it lives in `layering.py`.

One default differs from upstream's: `tokenizer_name` is `"tiny"` (the tokenizer that ships with
the package), not a hub id, so a new environment runs offline against the local CPU server. The
layering gives an environment that names no tokenizer its servers' tokenizer instead
(`layering.default_tokenizer`); upstream's `UPSTREAM_TOKENIZER` is used only for discovered
servers of an unnamed model, as upstream did.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretBytes, SecretStr, field_validator
from pydantic_core import to_jsonable_python

from atropos.envs.types import EvalHandlingEnum
from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig
from atropos.inference.tokenizer import TINY

__all__ = [
    "MODES",
    "BaseEnvConfig",
    "ConfigError",
    "Mode",
    "Namespace",
    "ResolvedConfig",
    "TeacherConfig",
    "UPSTREAM_TOKENIZER",
    "namespaces",
]

Mode = Literal["serve", "process", "evaluate"]
MODES: tuple[Mode, ...] = ("serve", "process", "evaluate")
UPSTREAM_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-3B-Preview"  # atroposlib 0.4.0's default
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the flag (or file, or variable)
    and the rule. The command line turns it into exit status 2."""


class Namespace(BaseModel):
    """Settings with their own command-line namespace, held by a field of an env config.

    A field `judge: JudgeConfig` (a `Namespace`) on an environment's config is set with
    `--judge.NAME VALUE`, `judge:` at the top of a `--config` file and `ATROPOS_JUDGE__NAME`,
    as upstream's teacher environments took `--teacher.*` beside `--env.*` and `--openai.*`.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TeacherConfig(Namespace):
    """`--teacher.*`: the teacher of on-policy distillation (`atropos.envs.teacher`), on when
    `base_url` names a server. Every environment has it: each group it makes then carries the
    teacher's top-k logprobs (`distill_token_ids`, `distill_logprobs`) before it is sent."""

    base_url: list[str] = Field(
        default_factory=list,
        description="teacher server(s), e.g. http://127.0.0.1:9002/v1; several comma-separated"
        " (none: no teacher)",
    )
    model_name: str = Field("default", description="the teacher's model name on its servers")
    api_key: SecretStr = Field(SecretStr(""), description="bearer key for the teacher servers")
    server_type: Literal["vllm", "sglang"] = Field(
        "vllm",
        description="vllm (also `atropos local serve`) | sglang: they return prompt logprobs",
    )
    tokenizer_name: str = Field(
        "", description="the teacher's tokenizer ('': its model's); must be the env's tokenizer"
    )
    top_k: int = Field(8, ge=1, le=1024, description="teacher logprobs kept per position")
    timeout: float = Field(600, gt=0, description="seconds one teacher request may take")

    @field_validator("base_url", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        """A string is one URL or several, comma-separated (`a/v1,b/v1`)."""
        if isinstance(value, str):
            return [url.strip() for url in value.split(",") if url.strip()]
        return value

    @property
    def enabled(self) -> bool:
        """Whether a teacher is configured (`base_url` names a server)."""
        return bool(self.base_url)

    def servers(self) -> list[APIServerConfig]:
        """One server configuration per teacher URL."""
        return [
            APIServerConfig.model_validate(
                {
                    "base_url": url,
                    "model_name": self.model_name,
                    "api_key": self.api_key,
                    "server_type": self.server_type,
                    "timeout": self.timeout,
                    "tokenizer_name": self.tokenizer_name or "none",
                }
            )
            for url in self.base_url
        ]


def namespaces(model: type[BaseModel]) -> dict[str, type[Namespace]]:
    """The fields of `model` that are namespaces, by name (`{"judge": JudgeConfig}`)."""
    found: dict[str, type[Namespace]] = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, Namespace):
            found[name] = kind
    return found


class BaseEnvConfig(BaseModel):
    """Settings of one environment (upstream's `BaseEnvConfig`, same names and defaults, except
    `tokenizer_name`: see the module's docstring).

    Subclass it for environment-specific settings; every field becomes a `--env.NAME` flag whose
    help is the field's description (or its attribute docstring).

    >>> BaseEnvConfig().group_size, BaseEnvConfig(group_size=8).group_size
    (4, 8)
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    group_size: int = Field(default=4, ge=1, description="sequences per group")
    max_num_workers: int = Field(
        default=-1, description="concurrent rollouts (-1: max_num_workers_per_node x servers)"
    )
    max_eval_workers: int = Field(default=16, ge=1, description="concurrent evaluation requests")
    eval_temperature: float = Field(
        default=0.0, ge=0, description="sampling temperature of evaluation (0: greedy)"
    )
    max_num_workers_per_node: int = Field(
        default=8, ge=1, description="rollouts per server when max_num_workers is -1"
    )
    steps_per_eval: int = Field(
        default=100, description="evaluate every N trainer steps (<= 0: never)"
    )
    eval_every: int = Field(
        default=0,
        ge=0,
        description="serve: evaluate each policy version the trainer publishes that is a multiple"
        " of N, on the servers' eval budget while rollouts go on; replaces steps_per_eval (0: off)",
    )
    max_token_length: int = Field(
        default=2048, ge=1, description="longest sequence this env produces (sent at registration)"
    )
    eval_handling: EvalHandlingEnum = Field(
        default=EvalHandlingEnum.STOP_TRAIN,
        description="training during evaluation: STOP_TRAIN, LIMIT_TRAIN or NONE",
    )
    eval_limit_ratio: float = Field(
        default=0.5, ge=0, le=1, description="share of workers kept during evaluation (LIMIT_TRAIN)"
    )
    inference_weight: float = Field(default=1.0, description="weight sent at registration")
    batch_size: int = Field(
        default=-1, description="trainer batch size (-1: taken from the API's /info)"
    )
    max_batches_offpolicy: int = Field(
        default=3, description="pause when this many batches are queued (<= 0: never pause)"
    )
    pace_staleness: bool = Field(
        default=True,
        description="with an API run with --max-staleness N, start rollouts only while none in"
        " flight can be trained more than N versions stale (false: the API discards them)",
    )
    tokenizer_name: str = Field(
        default=TINY,
        description="tokenizer to load: a hub id, a local directory or 'tiny' (the shipped one;"
        " unset: the servers' model)",
    )
    use_wandb: bool = Field(default=True, description="log to Weights & Biases")
    rollout_server_url: str = Field(
        default="http://localhost:8000", description="base URL of the trajectory API"
    )
    total_steps: int = Field(
        default=1000,
        ge=-1,
        description="serve: last trainer step (-1: ask the API); process: groups to make",
    )
    wandb_name: str | None = Field(
        default=None, description="registration and W&B run name (unset: the environment's name)"
    )
    num_rollouts_to_keep: int = Field(default=32, ge=0, description="groups kept for the W&B table")
    num_rollouts_per_group_for_logging: int = Field(
        default=1, ge=-1, description="rollouts per group in the W&B table (-1: all)"
    )
    ensure_scores_are_not_same: bool = Field(
        default=True, description="drop groups whose scores are all equal"
    )
    data_path_to_save_groups: str | None = Field(
        default=None, description="also write every valid group to this JSONL file"
    )
    data_dir_to_save_evals: str | None = Field(
        default=None, description="directory for evaluation metrics and samples"
    )
    min_items_sent_before_logging: int = Field(
        default=2, description="groups sent in a step before W&B logging (<= 0: always log)"
    )
    include_messages: bool = Field(
        default=False, description="add decoded messages to groups that have none"
    )
    min_batch_allocation: float | None = Field(
        default=None, ge=0, le=1, description="minimum share of every batch reserved for this env"
    )
    worker_timeout: float = Field(
        default=600,
        description="seconds before a rollout is cancelled, to within a quarter of it and at"
        " most 1 s late (<= 0: never)",
    )
    thinking_mode: bool = Field(
        default=False, description="ask the model to reason before answering"
    )
    reasoning_effort: ReasoningEffort | None = Field(
        default=None, description="none, minimal, low, medium, high or xhigh"
    )
    max_reasoning_tokens: int | None = Field(
        default=None, ge=1024, le=32000, description="reasoning token budget (1024 to 32000)"
    )
    custom_thinking_prompt: str | None = Field(
        default=None, description="system prompt used instead of the default thinking prompt"
    )
    # additions (all optional)
    rollout_server_api_key: SecretStr | None = Field(
        default=None, description="bearer key for the trajectory API (default: $ATROPOS_API_KEY)"
    )
    env_key: str | None = Field(
        default=None, description="stable identity of this env across restarts"
    )
    spool_dir: str | None = Field(
        default=None, description="where groups wait while the trajectory API is unreachable"
    )
    register_timeout: float = Field(
        default=600, ge=0, description="seconds to wait for the trainer at registration"
    )
    teacher: TeacherConfig = Field(
        default_factory=TeacherConfig,
        description="on-policy distillation's teacher: the --teacher.* settings",
    )

    @field_validator("max_num_workers", "batch_size")
    @classmethod
    def _minus_one_or_positive(cls, v: int) -> int:
        if v == -1 or v >= 1:
            return v
        raise ValueError(f"must be -1 or at least 1, got {v}")


@dataclass
class ResolvedConfig:
    """Everything a run needs, after layering: what `atropos.envs.runner.run` receives.

    `servers` is a list of concrete servers, or a `ServerBaseline` when servers are to be
    discovered (Slurm or the local default ports). `notes` say which defaults were chosen for
    settings nobody gave (the server, the tokenizer); the command line prints them first.
    """

    env: BaseEnvConfig
    servers: list[APIServerConfig] | ServerBaseline
    manager: ServerManagerConfig
    mode: Mode
    notes: list[str] = field(default_factory=list)
    verbose: bool = False  # `--verbose`: print the resolved configuration too

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain data with every secret (API keys) removed.

        The layout follows `--config` files (`env`, `openai`, `slurm`, ...) plus `mode`; `openai`
        is a list of servers, or one mapping when servers are discovered (a `ServerBaseline`).

        >>> r = ResolvedConfig(
        ...     BaseEnvConfig(rollout_server_api_key="k"),
        ...     [APIServerConfig(api_key="sk", base_url="http://h/v1")],
        ...     ServerManagerConfig(),
        ...     "serve",
        ... )
        >>> d = r.redacted()
        >>> "rollout_server_api_key" in d["env"], "api_key" in d["openai"][0]
        (False, False)
        """
        return {
            "mode": self.mode,
            "env": _plain(self.env),
            "openai": _plain(self.servers),
            **_plain(self.manager),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write `redacted()` as YAML to `path` (atomically; parent directories are created)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(self.redacted(), sort_keys=False)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"# atropos env {self.mode}: resolved configuration, secrets removed\n")
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def _is_secret(value: object) -> bool:
    return isinstance(value, (SecretStr, SecretBytes))


def _plain(value: Any) -> Any:
    """`value` as YAML-safe data, dropping secrets at any depth."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return {k: _plain(v) for k in fields if not _is_secret(v := getattr(value, k))}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if not _is_secret(v)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value if not _is_secret(v)]
    if isinstance(value, Enum):
        return _plain(value.value)
    return to_jsonable_python(value)
