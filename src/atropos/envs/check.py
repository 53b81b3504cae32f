"""`check_env`: does an environment keep the contract? (Gymnasium's `check_env`, for Atropos.)

It runs the env's own hooks against whatever inference servers it is configured with (in tests,
`atropos.testing.FakeInferenceServer`) and checks what comes out: `setup()` works,
`get_next_item()` gives items, `collect_trajectories()` returns groups of the configured size
whose tokens, masks, scores and logprobs line up and that the trajectory API would accept, and
say where their token ids came from. An evaluation-only environment (`evaluation_only`, which
refuses training items) is checked through `evaluate()` instead: its metrics must be finite
numbers named `eval/...`. Problems are collected and raised together.

    >>> from atropos.envs.check import EnvCheckError
    >>> str(EnvCheckError(["a", "b"]))
    'environment check failed:\\n- a\\n- b'
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from atropos import wire
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.runner.groups import as_groups


class EnvCheckError(AssertionError):
    """The environment breaks the contract; the message lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("environment check failed:\n" + "\n".join(f"- {p}" for p in problems))
        self.problems = problems


@dataclass
class CheckReport:
    """What `check_env` saw."""

    items: int = 0
    groups: int = 0
    token_sources: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


def _check_group(group: dict[str, Any], size: int, where: str, problems: list[str]) -> str | None:
    try:
        wire.check_group(wire.decode_group(wire.encode(group)), where)
    except wire.ProtocolError as err:
        problems.append(f"{where}: the API would refuse it: {err}")
        return None
    expected = (group.get("group_overrides") or {}).get("group_size", size)
    if len(group["tokens"]) != expected:
        problems.append(f"{where}: {len(group['tokens'])} sequences, group_size is {expected}")
    for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
        if all(m == -100 for m in masks):
            problems.append(f"{where}.masks[{i}]: every token is masked; nothing would be trained")
        if any(m != -100 and m != t for m, t in zip(masks, tokens, strict=True)):
            problems.append(f"{where}.masks[{i}]: a trained position must hold its token id")
    logprobs = group.get("inference_logprobs")
    if logprobs is not None:
        for i, (row, tokens) in enumerate(zip(logprobs, group["tokens"], strict=True)):
            if len(row) != len(tokens):
                problems.append(
                    f"{where}.inference_logprobs[{i}]: {len(row)} values for {len(tokens)} tokens"
                )
            elif any(not math.isfinite(x) or x > 1.0 for x in row):
                problems.append(
                    f"{where}.inference_logprobs[{i}]: values must be <= 0 (1.0 masked)"
                )
    if not all(isinstance(s, (int, float)) for s in group["scores"]):
        problems.append(f"{where}.scores: must be numbers")
    source = group.get("token_source")
    return str(source) if source else None


async def check_env_async(env: BaseEnv[Any], items: int = 2) -> CheckReport:
    """Run the checks on `env` (already constructed); raise EnvCheckError on any problem."""
    problems: list[str] = []
    report = CheckReport()
    if not isinstance(env, BaseEnv):
        raise EnvCheckError([f"{type(env).__name__} is not a subclass of atropos BaseEnv"])
    if not isinstance(env.config, BaseEnvConfig):
        problems.append("env.config must be a BaseEnvConfig (or a subclass)")
    if getattr(env, "evaluation_only", False):
        return await _check_evaluation(env, report, problems)
    try:
        await env.setup()
        for n in range(items):
            item = await env.get_next_item()
            if item is None:
                report.warnings.append(f"get_next_item() gave None after {n} items")
                break
            report.items += 1
            result = await env.collect_trajectories(item)
            if not (isinstance(result, tuple) and len(result) == 2):
                problems.append("collect_trajectories must return (group(s) or None, backlog list)")
                continue
            groups = as_groups(await env.postprocess_histories(result[0]))
            if not isinstance(result[1], list):
                problems.append("the backlog from collect_trajectories must be a list")
            for g, group in enumerate(groups):
                where = f"item {n} group {g}"
                source = _check_group(dict(group), env.config.group_size, where, problems)
                report.groups += 1
                if source is None:
                    report.warnings.append(f"{where}: no token_source (server ids or retokenized?)")
                else:
                    report.token_sources.add(source)
    finally:
        await env.aclose()
    if report.groups == 0 and not problems:
        problems.append("no group came out of collect_trajectories")
    if problems:
        raise EnvCheckError(problems)
    return report


async def _check_evaluation(
    env: BaseEnv[Any], report: CheckReport, problems: list[str]
) -> CheckReport:
    """An evaluation-only environment (it refuses training items): `setup()` and `evaluate()`
    run, and the metrics must be a non-empty mapping of finite numbers with `eval/` names."""
    try:
        await env.setup()
        metrics = await env.evaluate()
    finally:
        await env.aclose()
    if not isinstance(metrics, dict) or not metrics:
        problems.append(f"evaluate() must return its metrics (a non-empty dict), got {metrics!r}")
    else:
        for key, value in metrics.items():
            if not str(key).startswith("eval/"):
                problems.append(f"evaluate(): metric {key!r} is not named eval/...")
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"evaluate(): metric {key!r} is {value!r}, not a finite number")
        report.warnings.append("evaluation only: checked evaluate(), not training groups")
    if problems:
        raise EnvCheckError(problems)
    return report


def check_env(env: BaseEnv[Any], items: int = 2) -> CheckReport:
    """Check `env` (blocking); see the module docstring."""
    return asyncio.run(check_env_async(env, items))
