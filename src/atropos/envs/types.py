"""Data types environments produce, with atroposlib 0.4.0's names (an upstream env ports by
changing its imports).
"""

from __future__ import annotations

from contextvars import ContextVar
from enum import Enum
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

Item = Any
UUID = str

DROP_REASONS: ContextVar[dict[str, int] | None] = ContextVar("atropos_drop_reasons", default=None)
"""Where `BaseEnv.drop` counts, set by the runners around each item's `collect_trajectories`
(a context variable, so concurrent items never mix their reasons). It lives here, below both
`envs.base` and `envs.runner`, so that the runner needs nothing from `envs.base` at import."""


class Message(TypedDict):
    """A chat message; `reward` is optional and carried through untouched."""

    role: Literal["system", "user", "assistant", "tool"] | str
    content: Any
    reward: NotRequired[float | None]


class ScoredDataGroup(TypedDict, total=False):
    """One group on its way to the API, as an env builds it.

    The one definition of a group is `atropos.wire.Group`: this dict has its fields, types and
    optionality (tests/envs/test_group_contract.py holds them equal), and the runner sends it
    with `atropos.wire.encode_plain`.
    """

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None
    ref_logprobs: list[list[float]] | None
    messages: list[list[Message]] | None
    generation_params: dict[str, Any] | None
    inference_logprobs: list[list[float]] | None
    group_overrides: dict[str, Any] | None
    overrides: list[dict[str, Any]] | None
    images: Any
    distill_token_ids: list[list[list[int]]] | None
    distill_logprobs: list[list[list[float]]] | None
    env_id: int | None
    # extensions (optional; upstream's API ignores them)
    group_id: str | None
    policy_version: int | None
    token_source: str | None


class ScoredDataItem(TypedDict, total=False):
    """One trajectory, as the default `collect_trajectories` gathers them into a group."""

    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: list[float] | None
    ref_logprobs: list[float] | None
    messages: list[Message] | None
    inference_logprobs: list[float] | None
    group_overrides: dict[str, Any] | None
    overrides: dict[str, Any] | None
    images: Any
    distill_token_ids: list[list[int]] | None
    distill_logprobs: list[list[float]] | None
    token_source: str | None


class EvalHandlingEnum(Enum):
    """What training does while an evaluation runs."""

    STOP_TRAIN = "STOP_TRAIN"  # no new rollouts (in-flight ones finish)
    LIMIT_TRAIN = "LIMIT_TRAIN"  # at most eval_limit_ratio of the workers
    NONE = "NONE"  # train as usual
