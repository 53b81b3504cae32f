"""Checking and stamping groups before they leave an env, and writing them to JSONL.

Upstream's rules (atroposlib 0.4.0's `handle_send_to_api`), kept: a group of the wrong size is
dropped, as is one whose scores are all equal when `ensure_scores_are_not_same` is on, and one
holding a sequence at least the trainer's `max_token_len` long. Each drop is counted by reason.
New: every group gets a `group_id` (the API's idempotency key) and the `policy_version` it was
generated under (the older of the env's own stamp and the runner's: a rollout whose calls span
weight versions is as old as its oldest tokens), and the JSONL file is flushed after every
group (upstream never flushed it).
With a teacher (`--teacher.*`, `atropos.envs.teacher`), the groups that pass the checks get
its logprobs next, so no teacher call is spent on a group that is dropped anyway (upstream
asked the teacher first).
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from atropos import wire
from atropos.envs.outcome import Outcome, has_failed_row, row_outcomes
from atropos.envs.types import DROP_REASONS

if TYPE_CHECKING:  # annotations only: the runner drives an env, never imports its base
    from atropos.envs.base import BaseEnv
    from atropos.envs.teacher import Teacher


class _GroupIds:
    """Unique 32-hex-digit group ids, like `uuid.uuid4().hex` but without a `getrandom` call
    per id (about 3 us each, more in VMs): a random 64-bit prefix per process (drawn again in a
    forked child) and a counter."""

    def __init__(self) -> None:
        self._reseed()
        if hasattr(os, "register_at_fork"):  # POSIX
            os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._prefix = f"{random.SystemRandom().getrandbits(64):016x}"
        self._count = itertools.count(random.SystemRandom().getrandbits(32))

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFFFFFFFFFFFFFF:016x}"


new_group_id = _GroupIds()
"""A fresh `group_id` (the API's idempotency key): 32 hex digits, unique across processes."""


def as_groups(result: Any) -> list[dict[str, Any]]:
    """A collector's result as a list of groups (it may return one, a list, or None)."""
    if result is None:
        return []
    if isinstance(result, dict):
        return [result]
    return [g for g in result if g is not None]


def prepare(
    group: dict[str, Any],
    *,
    group_size: int,
    max_token_len: int,
    ensure_scores_differ: bool,
    policy_version: int | None,
    env_id: int | None,
    drops: Counter[str],
    decode: Any = None,
    failed: bool | None = None,
) -> dict[str, Any] | None:
    """Check a group; return it ready to send (stamped), or None after counting why not.
    `failed`: whether a row is marked `failed/...`, when the caller knows (None: looked up)."""
    tokens = group.get("tokens") or []
    overrides = group.get("group_overrides") or {}
    expected = overrides.get("group_size", group_size)
    if len(tokens) != expected:
        drops["wrong_group_size"] += 1
        return None
    if (
        has_failed_row(group) if failed is None else failed
    ):  # a failed rollout never reaches the trainer (envs.outcome)
        drops["failed_rollout"] += 1
        return None
    scores = group.get("scores") or []
    if ensure_scores_differ and len(scores) > 1 and all(s == scores[0] for s in scores):
        drops["identical_scores"] += 1
        return None
    if max_token_len > 0 and max(map(len, tokens), default=0) >= max_token_len:
        drops["too_long"] += 1
        return None
    out = dict(group)
    if decode is not None and not out.get("messages"):
        out["messages"] = [[{"role": "user", "content": decode(seq)}] for seq in tokens]
    if "group_id" not in out:
        out["group_id"] = new_group_id()
    if policy_version is not None:  # the oldest: the env's own stamp or the runner's
        own = out.get("policy_version")
        if isinstance(own, int) and not isinstance(own, bool):
            policy_version = min(own, policy_version)
        out["policy_version"] = policy_version
    if env_id is not None:
        out["env_id"] = env_id
    return out


async def ready_groups(
    env: BaseEnv,
    result: Any,
    dropped: EnvDrops,
    drops: Counter[str],
    *,
    max_token_len: int,
    policy_version: int | None,
    env_id: int | None,
    teacher: Teacher | None = None,
    outcomes: Counter[str] | None = None,
) -> list[dict[str, Any]]:
    """The groups of one item's `result`, checked and stamped (`checked_groups`), then given
    the teacher's logprobs (with a `teacher`): every group a runner sends or writes comes out
    of here (or out of `checked_groups` alone, when there is no teacher).

    A teacher failure that will repeat for every group raises (`teacher.TeacherError`).
    """
    kept = checked_groups(
        env, result, dropped, drops,
        max_token_len=max_token_len, policy_version=policy_version, env_id=env_id,
        outcomes=outcomes,
    )  # fmt: skip
    if teacher is not None and kept:
        kept = await teacher.annotate(kept, drops)
    return kept


def checked_groups(
    env: BaseEnv,
    result: Any,
    dropped: EnvDrops,
    drops: Counter[str],
    *,
    max_token_len: int,
    policy_version: int | None,
    env_id: int | None,
    outcomes: Counter[str] | None = None,
) -> list[dict[str, Any]]:
    """The groups of one item's `result`, checked and stamped by `prepare` under the env's
    config (a plain call: the serve runner makes no coroutine per group without a teacher).

    Every drop is counted in `drops`: the env's own (`dropped`) and the checks'. Every row the
    env returned is counted in `outcomes` by how it ended (`envs.outcome`), a group with a
    `failed/...` row is dropped as `failed_rollout`.
    """
    cfg = env.config
    groups = as_groups(result)
    failed = [_count_rows(outcomes, group) for group in groups]
    dropped.count(drops, groups)
    decode = (lambda seq: env.tokenizer.decode(seq)) if cfg.include_messages else None
    kept = []
    for group, failing in zip(groups, failed, strict=True):
        ready = prepare(
            group,
            group_size=cfg.group_size,
            max_token_len=max_token_len,
            ensure_scores_differ=cfg.ensure_scores_are_not_same,
            policy_version=policy_version,
            env_id=env_id,
            drops=drops,
            decode=decode,
            failed=failing,
        )
        if ready is not None:
            kept.append(ready)
    return kept


_SCORED = Outcome.SCORED.value


def _count_rows(outcomes: Counter[str] | None, group: dict[str, Any]) -> bool:
    """Count `group`'s rows in `outcomes` by how they ended (`envs.outcome.row_outcomes`) and
    say whether one is `failed/...`: one pass per group, and for a group without overrides (all
    scored) no list at all."""
    overrides = group.get("overrides")
    if not overrides:
        rows = len(group.get("tokens") or [])
        if outcomes is not None and rows:
            outcomes[_SCORED] += rows
        return False
    named = row_outcomes(group)
    if outcomes is not None:
        outcomes.update(named)
    for kind in set(named):  # a group holds one or two kinds
        if kind.startswith("failed"):
            return True
    return False


def plural(n: int, noun: str) -> str:
    """`n` and `noun`, plural when `n` is not 1.

    >>> plural(1, "group"), plural(2, "group"), plural(0, "group")
    ('1 group', '2 groups', '0 groups')
    """
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def unused_path(path: Path) -> Path:
    """`path`, or `stem_1`, `stem_2`, ... beside it if it exists (never overwrite a run)."""
    if not path.exists():
        return path
    for i in range(1, 100_000):
        candidate = path.with_name(f"{path.stem}_{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise FileExistsError(f"no free name beside {path}")


def encode_line(group: dict[str, Any]) -> bytes:
    """A group as one line of compact UTF-8 JSON (`atropos.wire.encode_plain`).

    >>> encode_line({"tokens": [[1, 2]], "scores": [0.5], "messages": None}).decode()
    '{"tokens":[[1,2]],"scores":[0.5],"messages":null}\\n'
    """
    return wire.encode_plain(group) + b"\n"


class JsonlSink:
    """Groups to a JSONL file, one per line, flushed as written (a kill loses nothing).

    The file is created with the first group, so a run that writes none leaves no empty file;
    `path` is chosen at once (`unused_path`: a name no earlier run has taken)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = unused_path(path)
        self._file: IO[bytes] | None = None
        self._closed = False
        self.count = 0

    def write(self, group: dict[str, Any]) -> None:
        if self._file is None:
            if self._closed:
                raise ValueError(f"{self.path} is closed")
            self._file = open(unused_path(self.path), "wb")  # noqa: SIM115
            self.path = Path(self._file.name)
        self._file.write(encode_line(group))
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


class EnvDrops:
    """The reasons `env.drop` gives while one item is collected (`with EnvDrops() as d:`
    around `collect_trajectories`; a context variable, so concurrent items never mix), then
    `d.count(drops, groups)`: the named reasons, or `by_env` when the env kept nothing and
    said nothing. A class, not a generator context manager: it is on every rollout's path."""

    __slots__ = ("reasons", "_token")

    def __enter__(self) -> EnvDrops:
        self.reasons: dict[str, int] = {}
        self._token = DROP_REASONS.set(self.reasons)
        return self

    def __exit__(self, *exc: object) -> None:
        DROP_REASONS.reset(self._token)

    def count(self, drops: Counter[str], groups: list[dict[str, Any]]) -> None:
        if self.reasons:
            drops.update(self.reasons)
        elif not groups:
            drops["by_env"] += 1
