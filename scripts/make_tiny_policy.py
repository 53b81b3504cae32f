#!/usr/bin/env python3
"""Rebuild the tiny warm-start policy shipped in src/atropos/tiny/policy/ (deterministic).

Trains a fresh tiny Llama on the `arithmetic` task (see `atropos.tiny.warmstart`), saves it in
Hugging Face format with the tiny tokenizer, and prints its held-out accuracy. The same seed on
the same torch gives the same weights.

Usage: python scripts/make_tiny_policy.py [--out DIR] [--seed S] [--steps N] [--no-eval]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from atropos.inference.tokenizer import import_transformers_quietly
from atropos.tiny.warmstart import WarmStartConfig, evaluate_policy, policy_path, warm_start


def main(argv: list[str] | None = None) -> int:
    defaults = WarmStartConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=policy_path(), help="output directory")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument(
        "--sloppiness", type=float, default=defaults.sloppiness, help="share of sums shown +1"
    )
    parser.add_argument("--train-items", type=int, default=None, help="(default: all)")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch threads")
    parser.add_argument("--eval-items", type=int, default=500, help="held-out items to score")
    parser.add_argument("--no-eval", action="store_true", help="skip the accuracy report")
    args = parser.parse_args(argv)
    import_transformers_quietly().logging.disable_progress_bar()

    config = dataclasses.replace(
        defaults,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sloppiness=args.sloppiness,
        train_items=args.train_items,
        threads=args.threads,
    )
    start = time.monotonic()
    out = warm_start(args.out, config, log=lambda line: print(line, flush=True))
    print(f"saved {out} after {time.monotonic() - start:.0f} s", flush=True)
    if not args.no_eval:
        metrics = evaluate_policy(out, n_items=args.eval_items, seed=args.seed)
        print(json.dumps({k: round(v, 4) for k, v in metrics.items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
