#!/usr/bin/env python3
"""The trainer's log-probabilities alone, forward and backward: chunked (`loss.token_logprobs`)
against the float32 cross-entropy over all logits at once (the step before), alternating.

    python benchmarks/token_logprobs.py                      # [8, 1024, 32000], float32 and bf16
    python benchmarks/token_logprobs.py --shape 4 512 32000 --reps 5

Prints milliseconds per forward+backward (the best of `--reps`, after one warm-up) per dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_gpu import full_token_logprobs  # noqa: E402

from atropos.trainer.loss import token_logprobs  # noqa: E402


def best_ms(fn: Callable[[], None], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=[8, 1024, 32000], metavar=("B", "T", "V"))
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    b, t, v = args.shape
    torch.manual_seed(0)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(b, t, v).to(dtype).requires_grad_(True)
        targets = torch.randint(0, v, (b, t))
        weights = torch.randn(b, t)

        def run(
            how: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            z: torch.Tensor = logits,
            ids: torch.Tensor = targets,
            w: torch.Tensor = weights,
        ) -> Callable[[], None]:
            def once() -> None:
                (how(z, ids) * w).sum().backward()
                z.grad = None

            return once

        name = str(dtype).removeprefix("torch.")
        results[name] = {
            "full_ms": best_ms(run(full_token_logprobs), args.reps),
            "chunked_ms": best_ms(run(token_logprobs), args.reps),
        }
        print(name, {k: round(x, 1) for k, x in results[name].items()}, flush=True)
    print(json.dumps({"shape": args.shape, "threads": torch.get_num_threads(), **results}))


if __name__ == "__main__":
    main()
