"""Trainer steps per second with in-flight weight transfers (`--sync transfer`, pause `keep`)
against `--sync reload`, on the demo's loop (API, local server, `arithmetic` env, trainer).

    .venv/bin/python benchmarks/sync_steps.py [--steps 30] [--rounds 1] [--model tiny]

`--model llama-134m` (or `llama-1b`) runs the same loop on a random Llama of that size built
here (benchmarks/weight_sync.py's sizes, the vocabulary cut to the shipped tokenizer's): a model
whose reload takes long enough for in-flight transfer to matter, for a GPU machine.

Each mode runs `atropos.demo.run.run_loop` for `--steps` steps (the demo's batch of 64
sequences), one after the other, same seed; from the trainer's metrics it reports the median
step time, the median sync time, and steps per second over the run (steps after the first, over
the time between the first and the last step's end, so start-up is left out). Writes
benchmarks/results/sync_steps.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from rich.console import Console

from atropos.demo.run import DemoConfig, catch_signals, run_loop
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing import tiny_tokenizer_path
from atropos.tiny.warmstart import policy_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = {"reload": [], "transfer (keep)": ["--sync", "transfer", "--transfer-pause", "keep"]}


def random_policy(size: str, directory: Path) -> Path:
    """A random Llama of `size` with the shipped tokenizer (and its vocabulary size)."""
    from weight_sync import build_big  # a sibling script: benchmarks/ is on sys.path

    if not (directory / "config.json").exists():
        directory.mkdir(parents=True, exist_ok=True)
        build_big(size, directory, vocab_size=len(load_tokenizer(str(tiny_tokenizer_path()))))
    return directory


def one(
    mode: str,
    flags: list[str],
    steps: int,
    out: Path,
    server_flags: list[str],
    policy: str,
    env_flags: list[str],
) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)  # a trainer would resume from an earlier run's steps
    cfg = DemoConfig(
        out=out,
        steps=steps,
        extra_trainer_flags=flags,
        extra_server_flags=server_flags,
        extra_env_flags=env_flags,
    )
    rows = run_loop(cfg, policy, Console(stderr=True))
    times = [r["time"] for r in rows] if all("time" in r for r in rows) else []
    step_s = [r["step_s"] for r in rows]
    later = step_s[1:]
    return {
        "steps": len(rows),
        "step_s_median": statistics.median(step_s),
        "sync_s_median": statistics.median(r["sync_s"] for r in rows),
        "data_wait_s_median": statistics.median(r.get("data_wait_s", 0.0) for r in rows),
        "steps_per_s": len(later) / (times[-1] - times[0])
        if len(times) > 1
        else 1 / statistics.mean(later),
        "served_versions_ok": [r["served_policy_version"] for r in rows]
        == list(range(1, steps + 1)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "runs" / "sync-steps"))
    p.add_argument("--json", default=str(HERE / "results" / "sync_steps.json"))
    p.add_argument(
        "--model",
        choices=["tiny", "llama-134m", "llama-1b"],
        default="tiny",
        help="the policy: the shipped tiny one (default) or a random Llama built here",
    )
    p.add_argument(
        "--transfer-backend",
        choices=["auto", "gloo", "nccl", "ipc"],
        default="auto",
        help="the transfer mode's group (one GPU shared by trainer and server: gloo)",
    )
    args = p.parse_args()
    catch_signals()  # SIGTERM (a timeout) stops the demo's processes too
    MODES["transfer (keep)"] += ["--transfer-backend", args.transfer_backend]
    # an ipc trainer needs the server to take IPC handles (its init carries no group)
    ipc = ["--transfer-backend", "ipc"] if args.transfer_backend == "ipc" else []
    policy, env_flags = str(Path(policy_path()).resolve()), []
    if args.model != "tiny":
        policy = str(random_policy(args.model, Path(args.out) / args.model))
        # a random policy scores every answer 0: keep those groups, or no batch ever fills
        env_flags = ["--env.ensure_scores_are_not_same", "false"]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode, flags in MODES.items():
            out = Path(args.out) / f"{mode.split()[0]}-{r}"
            server_flags = ipc if mode.startswith("transfer") else []
            results[mode].append(one(mode, flags, args.steps, out, server_flags, policy, env_flags))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(
        "| mode | steps | step s (median) | sync s (median) | data wait s (median) "
        "| steps/s | versions |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, runs in results.items():
        for x in runs:
            print(
                f"| {mode} | {x['steps']} | {x['step_s_median']:.3f} | {x['sync_s_median']:.3f} "
                f"| {x['data_wait_s_median']:.3f} "
                f"| {x['steps_per_s']:.3f} | {'1..N' if x['served_versions_ok'] else 'GAPS'} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
