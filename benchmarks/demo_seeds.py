"""The demo with 3 seeds: held-out accuracy of the warm start and of the trained policy.

    .venv/bin/python benchmarks/demo_seeds.py [--seeds 0 1 2] [--steps N] [--servers local vllm]
    .venv/bin/python benchmarks/demo_seeds.py --trainer trl   # TRL's GRPOTrainer as the trainer

Runs `atropos demo --server SERVER --seed S --out runs/demo-seeds/SERVER/S` one seed after
another (each server in turn, in one run: side by side), reads each run's summary.json, and
writes benchmarks/results/demo_seeds.{json,md} (`demo_seeds_vllm.*` when vLLM is among the
servers). The claim it checks, per server: the mean trained accuracy beats the warm start by
more than the spread (max - min) of the trained accuracy across seeds, and the mean on-policy
logprob mismatch stays at most 1e-3. `--server vllm` needs a Python with vLLM
(`python scripts/upstream_venv.py vllm` makes the checkout's; or $ATROPOS_VLLM_PYTHON).
`--trainer trl` runs the same loop with `python -m atropos.integrations.trl` as the trainer
(`trl_compare.demo_seed`, on the local server; the TRL venv: `scripts/upstream_venv.py trl`) and
writes `demo_seeds_trl.*`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seeds import run_seeds, write_result  # a sibling script: benchmarks/ is on sys.path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--servers", nargs="+", choices=("local", "vllm"), default=["local"])
    p.add_argument("--out", default=str(ROOT / "runs" / "demo-seeds"))
    p.add_argument("--json", default="")
    p.add_argument("--trainer", choices=("atropos", "trl"), default="atropos")
    args = p.parse_args()
    if args.trainer == "trl":
        return with_trl(args)
    name = "demo_seeds_vllm.json" if "vllm" in args.servers else "demo_seeds.json"
    results = {}
    for server in args.servers:
        out = Path(args.out) if args.servers == ["local"] else Path(args.out) / server
        rows = run_seeds(["--server", server], args.seeds, out, args.steps)
        results[server] = summarize(rows)
    result = results["local"] if args.servers == ["local"] else {"servers": results}
    write_result(result, Path(args.json or HERE / "results" / name), render)
    return 0


def with_trl(args: argparse.Namespace) -> int:
    """The seeds with TRL's GRPOTrainer as the trainer (local server only)."""
    from trl_compare import demo_seed, trl_python  # a sibling script

    out = Path(args.out) / "trl"
    rows = [demo_seed(s, args.steps or 100, out / str(s), trl_python()) for s in args.seeds]
    path = Path(args.json or HERE / "results" / "demo_seeds_trl.json")
    write_result(summarize(rows), path, render)
    return 0


def summarize(rows: list[dict]) -> dict:
    """One server's seeds: the rows, the mean gain over the warm start and its spread."""
    before = rows[0]["held-out accuracy, warm start"]
    after = [r["held-out accuracy, trained"] for r in rows]
    mismatch = [r["logprob mismatch, mean (on-policy tokens)"] for r in rows]
    result = {
        "rows": rows,
        "warm_start": before,
        "trained_mean": sum(after) / len(after),
        "trained_spread": max(after) - min(after),
        "gain": sum(after) / len(after) - before,
        "mismatch_max": max(m for m in mismatch if m is not None),
    }
    result["gain_beats_spread"] = result["gain"] > result["trained_spread"]
    return result


def render(result: dict) -> str:
    if "servers" in result:
        return "\n".join(
            f"### server: {server}\n\n{render(one)}" for server, one in result["servers"].items()
        )
    lines = [
        "| seed | steps | warm start | trained | reward first 10 | reward last 10 "
        "| mismatch (mean) | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['seed']} | {r['steps']} | {r['held-out accuracy, warm start']:.1%} "
            f"| {r['held-out accuracy, trained']:.1%} | {r['reward, first 10 steps']:.3f} "
            f"| {r['reward, last 10 steps']:.3f} "
            f"| {r['logprob mismatch, mean (on-policy tokens)']:.2e} | {r['seconds']} |"
        )
    lines.append(
        f"\nwarm start {result['warm_start']:.1%}; trained mean {result['trained_mean']:.1%}, "
        f"spread {result['trained_spread']:.1%}; gain {result['gain']:.1%} "
        f"({'beats' if result['gain_beats_spread'] else 'does NOT beat'} the spread); "
        f"largest mean mismatch {result['mismatch_max']:.2e}"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
