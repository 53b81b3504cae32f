"""Typed outcomes under injected faults: no rollout that hit an infrastructure fault is written
with a score, and every rollout is counted by how it ended.

Three environments, each run by the process runner in this process (what `atropos env process`
runs) against loopback fake servers until it has written `--groups` groups of 8 (1,000 rollouts
and more attempted): `arithmetic` (single-turn), the same items scored by a judge (a second
fake server), and `mcp_tools` (multi-turn tool use against its fixture MCP server). Every item
carries a nonce in its prompt; `atropos.testing.faults.FaultPlan` fails a fixed share of the
(nonce, turn) requests with a 500, a crash, a 429 or a hang past the client's deadline (the
policy's server; the judge's for the judged env), and records which nonces hit one. The audit
reads the written JSONL: rows whose nonce hit a fault (must be 0), and the runner's outcome
counts (`train/outcomes/*`), and the items that failed without a fault hitting them, by the
reason the runner counted (`faults.unexplained`).

    nice .venv/bin/python benchmarks/fault_outcomes.py --rate 0.1 --groups 125
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from atropos.envs.judge import JudgeConfig
from atropos.testing import FakeInferenceServer
from atropos.testing.faults import (
    FAILED,
    FaultArithmetic,
    FaultJudged,
    FaultPlan,
    audit,
    fault_mcp_tools,
    judge_says,
    right_answer,
    run_process,
    unexplained,
)

GROUP = 8


def run_env(cls: type, policy: str, out: Path, groups: int, **env: Any) -> Any:
    code, runner = run_process(cls, policy, out, groups, group_size=GROUP, workers=32,
                               server_wait=60, **env)  # fmt: skip
    if code != 0:
        raise SystemExit(f"{cls.__name__}: the run ended with status {code}")
    return runner


def one(name: str, rate: float, groups: int, seed: int, tmp: Path) -> dict[str, Any]:
    plan = FaultPlan(rate, seed=seed, hang=2.0)
    FAILED.clear()
    out = tmp / f"{name}.jsonl"
    with ExitStack() as stack:
        if name == "judged":
            policy = stack.enter_context(FakeInferenceServer(responder=right_answer))
            judge = stack.enter_context(FakeInferenceServer(responder=plan.responder(judge_says)))
            settings = JudgeConfig(base_url=judge.base_url, timeout=1.0, retries=1)
            started = time.process_time()
            runner = run_env(FaultJudged, policy.base_url, out, groups, judge=settings)
        elif name == "mcp_tools":
            from atropos.environments.mcp_tools import demo_responder

            policy = stack.enter_context(
                FakeInferenceServer(responder=plan.responder(demo_responder))
            )
            started = time.process_time()
            runner = run_env(fault_mcp_tools(), policy.base_url, out, groups)
        else:
            policy = stack.enter_context(
                FakeInferenceServer(responder=plan.responder(right_answer))
            )
            started = time.process_time()
            runner = run_env(FaultArithmetic, policy.base_url, out, groups)
        cpu = time.process_time() - started
    found = audit(out, [plan])
    outcomes = dict(runner.outcomes)
    return {
        "env": name, "found": found, "outcomes": outcomes, "cpu": cpu, "plan": plan,
        "unexplained": unexplained([plan]),
    }  # fmt: skip


def report(rows: list[dict[str, Any]], rate: float) -> str:
    lines = [
        "| env | rollouts | scored | truncated | invalid | failed (by reason) | hit by a fault"
        " | failed items without a fault | rows written | rows with a fault | process CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, f = r["outcomes"], r["found"]

        def kind(prefix: str, o: dict[str, int] = o) -> int:
            return sum(n for k, n in o.items() if k.startswith(prefix))

        failed = ", ".join(
            f"{k.removeprefix('failed/')} {n}" for k, n in sorted(o.items()) if k[:7] == "failed/"
        )
        plan = r["plan"]
        calls = ", ".join(f"{k} {n}" for k, n in sorted(plan.injected.items()))
        injected = f"{len(plan.faulted)} items ({calls})"
        alone = r["unexplained"]
        why = ", ".join(f"{k} {n}" for k, n in sorted(alone.items()))
        unhit = f"{sum(alone.values())} ({why})" if alone else "0"
        lines.append(
            f"| {r['env']} | {sum(o.values()):,} | {o.get('scored', 0):,} | {kind('truncated'):,}"
            f" | {kind('invalid'):,} | {kind('failed'):,} ({failed}) | {injected} | {unhit}"
            f" | {f['rows']:,} | {f['faulted_rows']} | {r['cpu']:.1f} |"
        )
    lines.append(
        f"\nfault rate {rate:g} per request (nonce, turn); group size {GROUP}; faulted responder"
        " calls in brackets (each choice of each attempt); process CPU includes the fake servers'"
        " threads."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=0.1, help="share of requests failed")
    parser.add_argument("--groups", type=int, default=125, help="groups to write per env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", default="arithmetic,judged,mcp_tools")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            one(name, args.rate, args.groups, args.seed, Path(tmp)) for name in args.envs.split(",")
        ]
    print(report(rows, args.rate))
    if any(r["found"]["faulted_rows"] for r in rows):
        raise SystemExit("a rollout that hit a fault was written with a score")


if __name__ == "__main__":
    main()
