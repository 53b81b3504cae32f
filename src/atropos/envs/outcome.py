"""How a rollout ended: the one definition of outcomes, infrastructure failures and limits.

Every rollout ends as one of four `Outcome`s:

- `scored`: it ran to its end and the env scored it.
- `failed`: the infrastructure failed it (an inference server, a sandbox, a tool server, a judge
  unreachable or timed out). It is never scored and never reaches the trainer: the env raises
  (`RolloutFailed`, `JudgeFailed`, `SandboxError`, an `InferenceError` after the manager's
  retries, a timeout) and the runners count the item's `group_size` rollouts as
  `failed/<reason>` (`failure_reason`). A group is all or nothing: one failed rollout fails
  its group (GRPO needs the whole group to compare within it).
- `truncated`: a limit was hit (`RolloutLimits`: turns, tokens, tool calls, seconds). Each env
  says what happens to it (`TruncatedRule`): `"score"` scores it as it stands, `"mask"` keeps
  it in its group with `set_advantage_to_zero` (its tokens are sent, e.g. for a KL term, but it
  is neither pushed up nor down). The existing per-sequence override is the mechanism, not
  dropping: dropping one row would leave the group short and drop the whole group.
- `invalid`: the policy's own fault (a malformed tool call, no answer). It is scored by the
  env's rule, as any other rollout, and counted as `invalid/<why>`.

An env says how a rollout ended in its group's per-sequence `overrides`: `{"outcome":
"truncated/turns"}` (`truncated(...)`), `{"outcome": "invalid/no_answer"}` (`invalid(...)`);
a row without one is `scored`. A row marked `failed/...` (`failed_row(...)`) makes the runner
drop its group (`dropped/failed_rollout`), so a failed rollout cannot reach the trainer even
when an env keeps the group. The runners count every row into `outcomes/<kind>[/<reason>]`
(`count_groups`, `count_failure`), in the env's metrics (`train/outcomes/...`) and in each
status poll's `failed` report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, Literal, TypeVar

from atropos.inference.errors import InferenceError

G = TypeVar("G", bound=Any)


class Outcome(str, Enum):
    """How a rollout ended (see the module docstring)."""

    SCORED = "scored"
    FAILED = "failed"
    TRUNCATED = "truncated"
    INVALID = "invalid"


TruncatedRule = Literal["score", "mask"]
"""What an env does with a truncated rollout: score it as it stands, or mask it (kept in its
group with `set_advantage_to_zero`)."""

TRUNCATED_RULES: tuple[str, ...] = ("score", "mask")

LIMITS: tuple[str, ...] = ("turns", "tokens", "tool_calls", "seconds")
"""The limits a `RolloutLimits` has, as named in `truncated/<limit>`."""


class RolloutFailed(Exception):
    """The infrastructure failed this rollout (not the policy): an env raises it instead of
    scoring 0. `reason` is a short word (`tool_server`, `sandbox`, `server`, ...), counted as
    `failed/<reason>`; `detail` says what happened."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.failure_kind = reason


def failure_reason(err: BaseException) -> str:
    """The `failed/<reason>` of an exception out of a rollout.

    An error's own `failure_kind` (`RolloutFailed`, `JudgeFailed`: `judge_timeout`), then
    `inference_<kind>` for an `InferenceError` (after the manager's retries), `timeout`,
    `sandbox_<reason>` for a `SandboxError`; anything else (a bug) is its type's name.

    >>> failure_reason(RolloutFailed("tool_server", "refused"))
    'tool_server'
    >>> failure_reason(InferenceError.from_status(503, "busy"))
    'inference_http_5xx'
    >>> failure_reason(asyncio.TimeoutError()), failure_reason(KeyError("x"))
    ('timeout', 'KeyError')
    """
    kind = getattr(err, "failure_kind", None)
    if isinstance(kind, str) and kind:
        return kind
    if isinstance(err, InferenceError):
        return f"inference_{err.kind}"
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    reason = getattr(err, "reason", None)
    if type(err).__name__ == "SandboxError" and isinstance(reason, str):
        return f"sandbox_{reason}"  # by name: envs sit below the sandbox package
    return type(err).__name__


@dataclasses.dataclass(frozen=True)
class RolloutLimits:
    """The bounds of one multi-turn rollout (None: unbounded): assistant turns, tokens the
    policy generated, tool calls, wall seconds. `exceeded(...)` names the first one reached.

    >>> limits = RolloutLimits(max_turns=4, max_tool_calls=2)
    >>> limits.exceeded(turns=3, tool_calls=2)
    'tool_calls'
    >>> limits.exceeded(turns=3) is None
    True
    """

    max_turns: int | None = None
    max_tokens: int | None = None
    max_tool_calls: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and (
                isinstance(value, bool) or not value > 0 or not math.isfinite(value)
            ):
                raise ValueError(
                    f"RolloutLimits.{field.name} {value!r}: give a positive number, or None"
                    " for no limit"
                )

    def exceeded(
        self,
        *,
        turns: int = 0,
        tokens: int = 0,
        tool_calls: int = 0,
        seconds: float = 0.0,
    ) -> str | None:
        """The limit reached by a rollout at these counts (`turns`, `tokens`, `tool_calls`,
        `seconds`: a `LIMITS` name), or None while every one is below its bound."""
        for name, used, bound in (
            ("turns", turns, self.max_turns),
            ("tokens", tokens, self.max_tokens),
            ("tool_calls", tool_calls, self.max_tool_calls),
            ("seconds", seconds, self.max_seconds),
        ):
            if bound is not None and used >= bound:
                return name
        return None

    def check(self, **used: float) -> None:
        """Raise `LimitReached` naming the limit when `exceeded(**used)` finds one."""
        limit = self.exceeded(**used)  # type: ignore[arg-type]
        if limit is not None:
            raise LimitReached(limit)


class LimitReached(Exception):
    """A `RolloutLimits` bound was reached (`limit`: a `LIMITS` name); an env's loop catches
    it and ends the rollout as `truncated/<limit>`."""

    def __init__(self, limit: str) -> None:
        super().__init__(f"rollout limit reached: {limit}")
        self.limit = limit


def check_rule(rule: str, where: str = "truncated") -> TruncatedRule:
    """`rule` when it is a `TruncatedRule`, else one clear error naming the choices."""
    if rule not in TRUNCATED_RULES:
        raise ValueError(f"{where} {rule!r}: use 'score' (scored as it stands) or 'mask'")
    return rule  # type: ignore[return-value]


def truncated(limit: str, rule: str = "score") -> dict[str, Any]:
    """The `overrides` entry of a rollout truncated by `limit` under the env's `rule`.

    >>> truncated("turns"), truncated("tokens", "mask")
    ({'outcome': 'truncated/turns'}, {'outcome': 'truncated/tokens', 'set_advantage_to_zero': True})
    """
    entry: dict[str, Any] = {"outcome": f"truncated/{limit}"}
    if check_rule(rule) == "mask":
        entry["set_advantage_to_zero"] = True
    return entry


def invalid(why: str) -> dict[str, Any]:
    """The `overrides` entry of a rollout the policy spoiled (scored by the env's rule)."""
    return {"outcome": f"invalid/{why}"}


def failed_row(reason: str) -> dict[str, Any]:
    """The `overrides` entry of a rollout the infrastructure failed: its group is dropped."""
    return {"outcome": f"failed/{reason}"}


def row_outcomes(group: Mapping[str, Any]) -> list[str]:
    """Each row's outcome in `group` (`scored` where its override names none)."""
    rows = len(group.get("tokens") or [])
    overrides = group.get("overrides") or []
    scored = Outcome.SCORED.value  # once: an enum member's value is a slow lookup
    out = []
    if type(overrides) is list and len(overrides) == rows:  # what envs build: one pass
        for entry in overrides:
            if type(entry) is not dict:
                break
            named = entry.get("outcome")
            out.append(named if isinstance(named, str) and named else scored)
        else:
            return out
        out = []
    for i in range(rows):
        entry = overrides[i] if i < len(overrides) else None
        # a dict first: `isinstance(x, Mapping)` is an ABC check, several times slower
        named = entry.get("outcome") if type(entry) is dict or isinstance(entry, Mapping) else None
        out.append(named if isinstance(named, str) and named else scored)
    return out


def has_failed_row(group: Mapping[str, Any]) -> bool:
    """Whether a row of `group` is marked `failed/...` (the group must not be sent)."""
    return any(o.startswith("failed") for o in row_outcomes(group))


def count_groups(outcomes: Counter[str], groups: Iterable[Mapping[str, Any]]) -> None:
    """Count every row of `groups` (what an env returned, before the runner's checks)."""
    for group in groups:
        outcomes.update(row_outcomes(group))


def count_failure(outcomes: Counter[str], err: BaseException, rollouts: int) -> str:
    """Count an item's `rollouts` as `failed/<reason>` for `err`; return the reason."""
    reason = failure_reason(err)
    outcomes[f"failed/{reason}"] += max(1, rollouts)
    return reason


def outcome_metrics(
    outcomes: Mapping[str, int], prefix: str = "train/outcomes/"
) -> dict[str, float]:
    """`outcomes` as metrics (`train/outcomes/scored`, `train/outcomes/failed/judge_timeout`)."""
    return {f"{prefix}{key}": float(n) for key, n in outcomes.items()}


def with_outcomes(group: G, entries: list[dict[str, Any]]) -> G:
    """`group` with each row's outcome entry (`truncated(...)`, `invalid(...)`, `{}` for a
    scored row) merged into its `overrides`; left as it is when every row is scored.

    >>> g = with_outcomes({"tokens": [[1], [2]]}, [{}, truncated("turns", "mask")])
    >>> g["overrides"]
    [{}, {'outcome': 'truncated/turns', 'set_advantage_to_zero': True}]
    """
    if not any(entries):
        return group
    rows = len(group.get("tokens") or [])  # a dict or a `ScoredDataGroup`
    if len(entries) != rows:
        raise ValueError(f"{len(entries)} outcome entries for a group of {rows} rows")
    old = group.get("overrides") or [{} for _ in range(rows)]
    group["overrides"] = [{**(o or {}), **e} for o, e in zip(old, entries, strict=True)]
    return group
