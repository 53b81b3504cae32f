#!/usr/bin/env python3
"""What `atropos train` costs per step over a bare PyTorch loop doing the same step, on the CPU.

Both train the tiny policy that ships with atropos (`--model tiny`: Llama, 4 layers, hidden
128, a 1,028-id vocabulary, float32) on the same batch: `--batch-size` sequences of `--seq-len`
tokens (a 16-token prompt masked, the rest trained, server logprobs on every trained token), one
forward and backward per step (`--micro-batch-size` = the batch), AdamW, clipping at 1.0, with
`--threads` torch threads (1 by default: steadier on a shared machine).

* **atropos train**: `atropos.trainer.train.train` (what the command runs), in this process,
  against a real API (`atropos api serve --store memory`, its own process) holding identical
  batches, `--sync none`, a checkpoint at the end. Run twice, for `warmup + 1` and for
  `warmup + steps + 1` steps: the difference of this process's CPU time over the two runs,
  divided by `steps`, is the CPU of a step, lease, acknowledgement, metrics and log included
  (start-up, warm-up and the final checkpoint cancel out). Wall `step_s` (metrics.jsonl) too.
* **bare loop**: the same model loaded the same way, the batch collated once, then per step:
  forward, `-cross_entropy` logprobs, the PPO-clip loss of the same advantages, backward,
  `clip_grad_norm_`, `AdamW.step`, `zero_grad`. Nothing else: no lease, no metrics, no syncs.
  Run before and after the trainer; per step: its CPU time (and wall).

The ratio is CPU per step, trainer over bare loop (median of the bare steps): on a loaded
machine CPU time is what the work costs, while wall time also holds the waits for cores that
other processes take (both are printed, with the load average).

    python benchmarks/trainer_overhead.py --json benchmarks/results/trainer_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from procstat import code_version, free_port, machine  # noqa: E402

from atropos.client.tensors import IGNORE, collate  # noqa: E402
from atropos.trainer.train import TrainConfig, train  # noqa: E402

PROMPT = 16
GROUP = 8
VOCAB = 1000  # the tiny policy's vocabulary is 1,028 ids


def groups(n: int, seq_len: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` groups of `GROUP` sequences of exactly `seq_len` tokens (mixed scores)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(10, VOCAB) for _ in range(PROMPT)]
        tokens, masks, logprobs = [], [], []
        for _ in range(GROUP):
            completion = [rng.randrange(10, VOCAB) for _ in range(seq_len - PROMPT)]
            tokens.append(prompt + completion)
            masks.append([-100] * PROMPT + completion)
            logprobs.append([1.0] * PROMPT + [-rng.uniform(3, 9) for _ in completion])
        scores = [float(i % 2) for i in range(GROUP)]
        out.append(
            {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": logprobs}
        )
    return out


def start_api(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "atropos",
        "api",
        "serve",
        "--store",
        "memory",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(argv, stdout=(tmp / "api.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the API did not answer in 120 s: {(tmp / 'api.log').read_text()[-2000:]}")


def trainer_run(args: argparse.Namespace, steps: int, tmp: Path) -> tuple[float, list[float]]:
    """One `atropos train` of `steps` steps on a fresh API: the CPU seconds `train` took in
    this process, and `step_s` of each step but the first `--warmup` and the last."""
    tmp.mkdir(parents=True, exist_ok=True)
    api, url = start_api(tmp)
    try:
        per_step = args.batch_size // GROUP
        reply = httpx.post(f"{url}/scored_data_list", json=groups(steps * per_step, args.seq_len))
        reply.raise_for_status()
        cfg = TrainConfig(
            model="tiny", api_url=url, out_dir=tmp / "run", batch_size=args.batch_size,
            micro_batch_size=args.batch_size, seq_len=args.seq_len, lr=1e-4, sync="none",
            steps=steps, checkpoint_every=0,
        )  # fmt: skip
        cpu0 = time.process_time()
        train(cfg)
        cpu = time.process_time() - cpu0
    finally:
        api.terminate()
        api.wait(timeout=30)
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return cpu, [r["step_s"] for r in rows[args.warmup : -1]]


def bare_steps(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """CPU and wall seconds of each step of the bare loop (after `--warmup` steps), on the
    trainer's batch."""
    from atropos.client.samples import samples_from_groups
    from atropos.local.weights import load_fp32
    from atropos.tiny.warmstart import policy_path
    from atropos.wire import decode_group_list, encode

    torch.manual_seed(0)
    model: Any = load_fp32(str(policy_path()))
    model.train()
    batch = decode_group_list(encode(groups(args.batch_size // GROUP, args.seq_len)))
    mb = collate(samples_from_groups(batch, args.seq_len), model.config.pad_token_id or 0)
    ids, targets, old, adv = mb.input_ids, mb.targets, mb.old_logp, mb.advantages
    mask = (targets != IGNORE).float()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    cpu, wall = [], []
    for _ in range(args.warmup + args.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        flat = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
            ignore_index=IGNORE, reduction="none",
        )  # fmt: skip
        logp = -flat.view(targets.shape)
        ratio = torch.exp(logp - torch.where(mask.bool(), old, logp.detach()))
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()
        del logits
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return cpu[args.warmup :], wall[args.warmup :]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warmup", type=int, default=3, help="steps left out first")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both loops)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.batch_size % GROUP:
        raise SystemExit(f"--batch-size must be a multiple of {GROUP} (whole groups)")
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    bare_cpu, bare_wall = bare_steps(args)
    with tempfile.TemporaryDirectory(prefix="trainer-overhead-") as tmp:
        short_cpu, _ = trainer_run(args, args.warmup + 1, Path(tmp) / "short")
        long_cpu, ours_wall = trainer_run(args, args.warmup + args.steps + 1, Path(tmp) / "long")
    after_cpu, after_wall = bare_steps(args)
    ours_cpu = (long_cpu - short_cpu) / args.steps  # startup and final checkpoint cancel
    bare = statistics.median(bare_cpu + after_cpu)
    doc = {
        "cpu_s_per_step": {"atropos train": ours_cpu, "bare loop": bare},
        "cpu_ratio": ours_cpu / bare,
        "wall_s_per_step_median": {
            "bare loop, before": statistics.median(bare_wall),
            "atropos train": statistics.median(ours_wall),
            "bare loop, after": statistics.median(after_wall),
        },
    }
    doc["wall_ratio"] = doc["wall_s_per_step_median"]["atropos train"] / statistics.median(
        bare_wall + after_wall
    )
    print(json.dumps(doc, indent=1))
    verdict = "met" if doc["cpu_ratio"] <= 1.1 else "MISSED"
    print(f"atropos train / bare loop, CPU per step: {doc['cpu_ratio']:.3f}x (<= 1.1x: {verdict})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        extra = {"machine": machine(), "code": code_version(), "load_average_before": load}
        args.json.write_text(json.dumps({"args": vars(args), **doc, **extra}, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
