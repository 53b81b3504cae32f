"""code_execution's throughput: the old home-made sandbox (a git revision, checked out in a
temporary worktree) against the new `atropos.sandbox` layer per provider, side by side.

    .venv/bin/python benchmarks/code_execution_sandbox.py --old-rev a319f8b~1 --rounds 3

Each way judges the shipped fixture problems (train and test) with their reference solutions
and with a failing answer each (`wrong_answer`), `--concurrency` at once (the env's
`max_concurrency`), `--rounds` times, and reports completions judged per second, its p50/p95
latency and every verdict's pass count (which must match between ways). Each way runs in its
own process; the old one with PYTHONPATH on the worktree's `src`. The ways alternate round by
round, so a loaded machine slows them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(impl: str, provider: str, concurrency: int) -> dict[str, object]:
    """One round in this process: every fixture completion judged, `concurrency` at once."""
    from atropos.environments import code_execution as ce
    from atropos.environments.code_execution import problems

    items = problems.load_problems("train") + problems.load_problems("test")
    jobs = [(i, ce.right_answer(i)) for i in items] + [(i, ce.wrong_answer(i)) for i in items]
    if impl == "old":
        from atropos.environments.code_execution.sandbox import (  # type: ignore[attr-defined]
            Sandbox,
            SandboxLimits,
        )

        runner = Sandbox(SandboxLimits(wall_seconds=10, cpu_seconds=5), max_concurrency=concurrency)
    else:
        from atropos.environments.code_execution.sandbox import CodeRunner

        runner = CodeRunner(provider=provider, timeout=10, max_concurrency=concurrency)

    async def one(item: dict, completion: str) -> tuple[float, bool]:
        start = time.perf_counter()
        verdict = await problems.acheck_solution(runner, item, completion)
        return time.perf_counter() - start, verdict.passed

    async def main() -> list[tuple[float, bool]]:
        return await asyncio.gather(*(one(i, c) for i, c in jobs))

    start = time.perf_counter()
    done = asyncio.run(main())
    wall = time.perf_counter() - start
    if impl == "old":
        runner.close()
    latencies = sorted(d for d, _ in done)
    return {
        "judged": len(done),
        "passed": sum(p for _, p in done),
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
    }


def run_way(impl: str, provider: str, concurrency: int, old_src: Path | None) -> dict:
    env = dict(os.environ)
    if impl == "old":
        assert old_src is not None
        env["PYTHONPATH"] = str(old_src)
    argv = [sys.executable, __file__, "--one", impl, provider, str(concurrency)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worktree(rev: str) -> Path:
    path = Path("/tmp") / f"atropos-ce-old-{rev.replace('~', '_').replace('/', '_')}"
    if not path.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
            check=True,
            capture_output=True,
        )
    return path / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-rev", default=None, help="git revision of the old sandbox")
    parser.add_argument("--providers", default="bubblewrap,process")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        impl, provider, concurrency = args.one
        print(json.dumps(measure(impl, provider, int(concurrency))))
        return
    ways = [("new", p) for p in args.providers.split(",")]
    old_src = worktree(args.old_rev) if args.old_rev else None
    if old_src is not None:
        ways.insert(0, ("old", "supervisor"))
    results: dict[tuple[str, str], list[dict]] = {w: [] for w in ways}
    for _ in range(args.rounds):
        for impl, provider in ways:
            results[(impl, provider)].append(run_way(impl, provider, args.concurrency, old_src))
    print(f"concurrency {args.concurrency}, {args.rounds} rounds, {os.cpu_count()} cores")
    print("| way | judged/round | passed | judged/s (median) | min-max | p50 ms | p95 ms |")
    print("|---|---|---|---|---|---|---|")
    for (impl, provider), rounds in results.items():
        rates = [r["judged"] / r["wall_s"] for r in rounds]
        print(
            f"| {impl} {provider} | {rounds[0]['judged']} | {rounds[0]['passed']} |"
            f" {statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} |"
            f" {statistics.median(r['p50_ms'] for r in rounds):.0f} |"
            f" {statistics.median(r['p95_ms'] for r in rounds):.0f} |"
        )


if __name__ == "__main__":
    main()
