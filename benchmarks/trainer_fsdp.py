#!/usr/bin/env python3
"""The trainer's step on 2 CPU processes (FSDP2 under torchrun, gloo) against 1 (the trainer's
default: no process group, no sharding): tokens/s and peak memory per process.

Like with like: each process has one thread (`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`),
as each rank has one GPU on a GPU machine; so 2 processes use 2 cores and 1 process one. The
model is a random Llama of ~134M parameters (`--size 134m`: 12 layers of width 768, a 32k
vocabulary, untied head; built here, nothing downloaded), large enough that a step is compute,
not overhead. The same global batch for both (`--batch-size` sequences of `--seq-len` tokens,
micro-batches of `--micro-batch-size` per process), the trainer's own step
(`atropos.trainer.step.train_step`, through `benchmarks/trainer_gpu.py`'s set-up).

Memory per process: the peak resident set while stepping (the kernel's high-water mark, reset
once the model is built and sharded: `/proc/self/clear_refs`), and the peak over the whole
process (which includes building the full model on each process before sharding it); glibc's
malloc is told to return large blocks (`MALLOC` below).

The defaults are an RL trainer's shape scaled to a CPU: 8 sequences of 512 tokens per step, 2
per pass (4 passes on one process, 2 on each of two), with activation checkpointing (each
block's activations recomputed in backward), so that the weights, gradients and AdamW state
are most of the memory, as in a real run. FSDP gathers every block's weights for each pass and
reduce-scatters its gradients, over gloo on the loopback here: the fewer the tokens per pass,
the more that traffic weighs. `--no-activation-checkpointing --batch-size 16
--micro-batch-size 8` is the other end: activations of 4096 tokens per pass (unsharded, the
same on each process) dominate the memory.

Usage:
    python benchmarks/trainer_fsdp.py --json benchmarks/results/trainer_fsdp.json
    python benchmarks/trainer_fsdp.py --no-activation-checkpointing --batch-size 16 \
        --micro-batch-size 8 --json benchmarks/results/trainer_fsdp_no_ac.json
    python benchmarks/trainer_fsdp.py --size tiny --steps 1 --warmup 0     # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402
import trainer_gpu  # noqa: E402

from atropos.trainer.ranks import Ranks  # noqa: E402

MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
"""glibc's malloc keeps freed heap memory in the process, so the peak resident set would count
memory long freed (FSDP frees and reallocates each block's gathered weights every pass): blocks
of 128 KiB and more are mapped and unmapped instead, for both runs alike, and the peak is the
memory in use."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(trainer_gpu.SIZES), default="134m")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (global)")
    p.add_argument("--micro-batch-size", type=int, default=2, help="sequences per pass")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each block's activations in backward (default: on)",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one measurement, to here
    p.set_defaults(  # what trainer_gpu.prepare reads of its own flags
        lengths="", layout="padded", attention="sdpa", logprobs="chunked", fused_adamw=False
    )
    return p.parse_args(argv)


def rss_gib(field: str) -> float:
    """`VmHWM` (peak) or `VmRSS` (now) of this process, in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(args: argparse.Namespace) -> None:
    """One measurement: under torchrun one rank of the sharded trainer, else one process."""
    torch.set_num_threads(1)
    ranks = Ranks.from_env("cpu")
    try:
        setup = trainer_gpu.prepare(args, ranks)
        ranks.barrier("setting up")
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
        before = rss_gib("VmRSS")
        times = trainer_gpu.time_steps(
            setup.model, setup.opt, setup.params, setup.samples, setup.settings, ranks, args
        )
        mine = {"ready_gib": before, "step_peak_gib": rss_gib("VmHWM")}
        mine["process_peak_gib"] = trainer_gpu.peak_memory(ranks)  # ru_maxrss: all along
        every = ranks.gather(mine, "gathering memory")
        if ranks.main:
            tokens = len(setup.samples) * args.seq_len
            result = {
                "processes": ranks.world, "sharded": ranks.distributed,
                "parameters": setup.n_params, "step_s": times, "tokens_per_step": tokens,
                "tokens_per_s": tokens * len(times) / sum(times), "memory": every,
            }  # fmt: skip
            args.worker.write_text(json.dumps(result))
    finally:
        ranks.close()


def measure(args: argparse.Namespace, processes: int, folder: Path) -> dict[str, Any]:
    """Run the worker on `processes` processes (1: plain python, no process group)."""
    out = folder / f"p{processes}.json"
    flags = [
        "--size", args.size, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
        "--micro-batch-size", str(args.micro_batch_size), "--warmup", str(args.warmup),
        "--steps", str(args.steps), "--worker", str(out),
    ]  # fmt: skip
    if not args.activation_checkpointing:
        flags.append("--no-activation-checkpointing")
    launcher = [sys.executable]
    if processes > 1:
        launcher += [
            "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **MALLOC}
    t0 = time.perf_counter()
    subprocess.run([*launcher, __file__, *flags], env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def summary(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    def worst(run: dict[str, Any], key: str) -> float:
        return float(max(m[key] for m in run["memory"]))

    return {
        "speedup": two["tokens_per_s"] / one["tokens_per_s"],
        "step_peak_ratio": worst(two, "step_peak_gib") / worst(one, "step_peak_gib"),
        "process_peak_ratio": worst(two, "process_peak_gib") / worst(one, "process_peak_gib"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        worker(args)
        return 0
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        one = measure(args, 1, Path(tmp))
        two = measure(args, 2, Path(tmp))
    ratios = summary(one, two)
    print(f"{'':28}{'1 process':>12}{'2 processes':>14}")
    print(f"{'tokens/s':28}{one['tokens_per_s']:12.1f}{two['tokens_per_s']:14.1f}")
    labels = {"step_peak_gib": "peak RSS stepping, GiB", "process_peak_gib": "peak RSS, GiB"}
    for key, label in labels.items():
        worst_two = max(m[key] for m in two["memory"])
        print(f"{label:28}{one['memory'][0][key]:12.2f}{worst_two:14.2f}")
    print(
        f"speed-up {ratios['speedup']:.2f}x; memory per process while stepping"
        f" {ratios['step_peak_ratio']:.2f}x, over the whole process"
        f" {ratios['process_peak_ratio']:.2f}x (load average before:"
        f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "load_before": load}
        record |= {"one": one, "two": two, **ratios, "torch": torch.__version__}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
