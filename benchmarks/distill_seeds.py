"""`atropos demo --distill` with 3 seeds: how much of the gap to the teacher the student closes.

    .venv/bin/python benchmarks/distill_seeds.py [--seeds 0 1 2] [--steps N] [--teacher DIR]

The teacher is trained once (the RL demo's loop, seed 0, `--teacher-steps`, into
`runs/distill-seeds/teacher`) unless `--teacher` names a checkpoint; then, one seed after
another, `atropos demo --distill --teacher T --seed S --out runs/distill-seeds/S` distills the
shipped warm start toward it with no reward (`--loss opd`, reverse KL on the sampled tokens).
Writes benchmarks/results/distill_seeds.{json,md}. The claim it checks (issue 20's target): the
student closes at least half of its held-out accuracy gap to the teacher within the demo's
budget, on average over the seeds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from seeds import run_seeds, write_result  # a sibling script: benchmarks/ is on sys.path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def ensure_teacher(args: argparse.Namespace) -> Path:
    """The teacher checkpoint: `--teacher`, or the RL demo run once for it."""
    if args.teacher:
        return Path(args.teacher).resolve()
    out = Path(args.out) / "teacher"
    final = out / "trainer" / "checkpoints" / f"step_{args.teacher_steps}"
    if not (final / "config.json").exists():
        argv = [sys.executable, "-m", "atropos", "demo", "--seed", "0", "--out", str(out),
                "--steps", str(args.teacher_steps)]  # fmt: skip
        print(f"teacher: {' '.join(argv[1:])}", flush=True)
        subprocess.run(argv, check=True, cwd=ROOT)
    return final.resolve()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="distillation steps (demo default)")
    p.add_argument("--teacher", default="", help="a teacher checkpoint (default: trained here)")
    p.add_argument("--teacher-steps", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "runs" / "distill-seeds"))
    p.add_argument("--json", default=str(HERE / "results" / "distill_seeds.json"))
    args = p.parse_args()
    teacher = ensure_teacher(args)
    rows = run_seeds(
        ["--distill", "--teacher", str(teacher)], args.seeds, Path(args.out), args.steps
    )
    closed = [r["share of the gap closed"] for r in rows]
    result = {
        "teacher": str(teacher),
        "rows": rows,
        "gap_closed_mean": sum(closed) / len(closed),
        "gap_closed_min": min(closed),
    }
    result["target_met"] = result["gap_closed_mean"] >= 0.5
    write_result(result, Path(args.json), render)
    return 0


def render(result: dict) -> str:
    lines = [
        "| seed | steps | student before | teacher | student after | gap closed "
        "| reverse KL first 10 | last 10 | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['seed']} | {r['steps']} | {r['held-out accuracy, student before']:.1%} "
            f"| {r['held-out accuracy, teacher']:.1%} "
            f"| {r['held-out accuracy, student after']:.1%} "
            f"| {r['share of the gap closed']:.0%} "
            f"| {r['reverse KL to the teacher, first 10 steps']:.3f} "
            f"| {r['reverse KL to the teacher, last 10 steps']:.3f} | {r['seconds']} |"
        )
    lines.append(
        f"\nshare of the gap closed: mean {result['gap_closed_mean']:.0%}, lowest "
        f"{result['gap_closed_min']:.0%} (target: at least 50% on average: "
        f"{'met' if result['target_met'] else 'NOT met'})"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
