"""Judges with budgets: N judgments at once against a fake judge provider that rate-limits.

The provider (`atropos.testing.fake_judge.FakeJudge`, in this process) allows `--provider-rpm`
requests a minute (a token bucket holding one second's worth) and answers 429 with
`Retry-After` past it. Each client runs in its own process and fires `--judgments` judge calls
at once (a judgment: one `Judge.complete` of one answer), as a burst of scored groups would:

- `old`: the judge client before budgets (the commit `--old` names, checked out with
  `git worktree add`): the server manager's retries (3 attempts, Retry-After up to 10 s);
- `new, no rpm`: the budgeted client with its defaults (64 in flight, 429 pauses, retries);
- `new, rpm`: the same with `--judge.rpm` at `--budget-share` of the provider's limit.

Per client: requests the provider saw, 429s it sent, judgments completed and failed (by
reason), seconds, and the most requests in any one-second window.

    .venv/bin/python benchmarks/judge_budget.py --old a6d9c40~1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [
    {"role": "system", "content": "Answer \\boxed{A} or \\boxed{B}."},
    {"role": "user", "content": "[Response A] The fog rolls in.\n[Response B] It is dark."},
]


class StubEnv:
    """What a `Judge` needs of its environment when the judge has its own server."""

    def __init__(self) -> None:
        from atropos.inference.config import ServerManagerConfig

        self.manager_config = ServerManagerConfig()
        self.server = None

    def on_close(self, hook: Any) -> None:
        pass


async def judgments(url: str, count: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Fire `count` judge calls at once; what became of them."""
    from atropos.envs.judge import Judge, JudgeConfig

    judge = Judge(JudgeConfig(base_url=url, max_tokens=16, **settings), StubEnv())  # type: ignore[arg-type]
    outcomes: Counter[str] = Counter()

    async def one() -> None:
        try:
            await judge.complete(MESSAGES, 1)  # type: ignore[arg-type]
        except Exception as err:  # the old client: InferenceError; the new: JudgeFailed
            reason = getattr(err, "reason", None) or getattr(err, "kind", type(err).__name__)
            outcomes[f"failed/{reason}"] += 1
        else:
            outcomes["completed"] += 1

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(count)))
    seconds = time.monotonic() - started
    await judge.aclose()
    return {"outcomes": dict(outcomes), "seconds": seconds}


def child(args: argparse.Namespace) -> int:
    result = asyncio.run(judgments(args.url, args.judgments, json.loads(args.settings)))
    print(json.dumps(result))
    return 0


def run_client(
    name: str, src: Path, settings: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    from atropos.testing.fake_judge import FakeJudge

    with FakeJudge(rpm=args.provider_rpm) as provider:
        env = {**os.environ, "PYTHONPATH": str(src)}
        command = [
            sys.executable,
            __file__,
            "--child",
            "--url",
            provider.base_url,
            "--judgments",
            str(args.judgments),
            "--settings",
            json.dumps(settings),
        ]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"{name}: {done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result.update(
            client=name,
            requests=len(provider.arrivals),
            http_429=provider.statuses[429],
            served=provider.statuses[200],
            peak_per_second=max(provider.windows(1.0), default=0),
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", default="a6d9c40~1", help="commit of the old judge client")
    parser.add_argument("--judgments", type=int, default=1000)
    parser.add_argument("--provider-rpm", type=float, default=3000)
    parser.add_argument("--budget-share", type=float, default=0.95)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    results = []
    with tempfile.TemporaryDirectory(prefix="judge-old-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
            check=True,
            capture_output=True,
        )
        try:
            results.append(run_client("old", old / "src", {}, args))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False
            )
    results.append(run_client("new, no rpm", ROOT / "src", {}, args))
    rpm = args.provider_rpm * args.budget_share
    results.append(run_client(f"new, rpm {rpm:g}", ROOT / "src", {"rpm": rpm}, args))
    print(
        f"{args.judgments} judgments at once; provider {args.provider_rpm:g} rpm"
        f" ({args.provider_rpm / 60:g}/s, burst 1 s)"
    )
    print("| client | requests | 429s | completed | failed | seconds | peak req/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        failed = {
            k.removeprefix("failed/"): n for k, n in r["outcomes"].items() if k != "completed"
        }
        print(
            f"| {r['client']} | {r['requests']} | {r['http_429']} |"
            f" {r['outcomes'].get('completed', 0)} | {sum(failed.values())} {failed or ''} |"
            f" {r['seconds']:.1f} | {r['peak_per_second']} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
