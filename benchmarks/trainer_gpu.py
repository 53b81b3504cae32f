#!/usr/bin/env python3
"""Tokens/s and model FLOPs utilisation of the trainer's real step (FSDP2, bf16) on GPUs.

A random Llama (`--size`: ~0.5B, ~1.1B or ~1.5B parameters, built on the device: nothing is
downloaded) is sharded exactly as `atropos train` shards it under torchrun
(`atropos.trainer.fsdp.shard`: `fully_shard` per decoder block, then the model; bf16 weights in
forward and backward, float32 shards, gradients reduced in float32) and trained with the
trainer's own step (`atropos.trainer.step.train_step`: the batch split across ranks by tokens,
micro-batches, the GRPO PPO-clip loss, clipping, AdamW) on a synthetic batch of fixed shape:
`--batch-size` sequences of `--seq-len` tokens (a 64-token prompt, the rest trained). No API,
no inference server: the step alone.

After `--warmup` steps, `--steps` steps are timed (CUDA synchronised around each). Reported:
step time (mean and median), tokens/s (all ranks; tokens = sequences x positions), peak GPU
memory per rank, and MFU = 6 x N x tokens/s / (ranks x peak bf16 FLOP/s), with N the parameters
that do matrix products (all but the input embedding; attention's own FLOPs are not counted,
so MFU is a slight underestimate at long sequences). The peak comes from the GPU's name
(H100 SXM and H200: 989.4e12 dense bf16) or `--peak-flops`.

`--lengths MIN:MAX` draws each sequence's length (tokens and MFU then count real positions
only, so padding is work that earns nothing); `--layout packed` runs each pass's sequences end
to end in one row (`--attention flash_attention_2` or `flex_attention` to keep them apart
without a dense mask); `--logprobs full` swaps in the float32 cross-entropy over all logits at
once that the step used before its chunked log-probabilities, to compare in one run;
`--count-syncs` counts one step's synchronising CUDA calls (`torch.cuda.set_sync_debug_mode`).
`benchmarks/gpu_trainer_step.sh` runs the comparisons in one device slot.

Usage:
    python benchmarks/trainer_gpu.py --size 1b --json runs/trainer_gpu.json
    torchrun --nproc-per-node 8 benchmarks/trainer_gpu.py --size 1.5b --json runs/gpu8.json
    python benchmarks/trainer_gpu.py --device cpu --size tiny --steps 2    # a check, no GPU

Plain `python` is one process in a process group of one (the same FSDP2 code as torchrun's).
Needs torch, transformers and atropos (`PYTHONPATH=src` from a checkout) only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # a bare checkout

import atropos.trainer.step as step_module  # noqa: E402
from atropos.client.samples import Sample  # noqa: E402
from atropos.trainer.fsdp import checkpoint_activations, shard  # noqa: E402
from atropos.trainer.ranks import Ranks  # noqa: E402
from atropos.trainer.step import StepSettings, train_step  # noqa: E402

SIZES: dict[str, dict[str, int]] = {  # Llama shapes; vocabulary 32000, untied head
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "134m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12),  # for CPUs (trainer_fsdp.py)
    "0.5b": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=8),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
    "1.5b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=22,
                 num_attention_heads=16, num_key_value_heads=8),
}  # fmt: skip
PEAK_BF16 = {  # dense bf16 FLOP/s by a substring of torch.cuda.get_device_name()
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "H200": 989.4e12,
    "GH200": 989.4e12,
    "A100": 312.0e12,
}
PROMPT = 64


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="1b")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--batch-size", type=int, default=0, help="sequences per step (0: 32 x ranks)")
    p.add_argument("--micro-batch-size", type=int, default=8, help="sequences per pass")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument(
        "--lengths", default="", help="MIN:MAX: sequence lengths drawn in [MIN, MAX] (default: all"
        " --seq-len); tokens and MFU count real positions, so padding is work that does not count",
    )  # fmt: skip
    p.add_argument("--layout", choices=["padded", "packed"], default="padded")
    p.add_argument("--attention", default="sdpa", help="transformers' attn_implementation")
    p.add_argument(
        "--logprobs", choices=["chunked", "full"], default="chunked",
        help="full: the float32 cross-entropy over all logits at once (the step before chunking)",
    )  # fmt: skip
    p.add_argument(
        "--fused-adamw", action="store_true",
        help="AdamW(fused=True): one kernel for the update (the trainer uses torch's default)",
    )  # fmt: skip
    p.add_argument(
        "--count-syncs", action="store_true",
        help="CUDA: count the step's synchronising calls (torch.cuda.set_sync_debug_mode)",
    )  # fmt: skip
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    p.add_argument("--peak-flops", type=float, default=0.0, help="peak bf16 FLOP/s of one GPU")
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def one_process_group() -> None:
    """Plain `python`: torchrun's variables for a world of one, so the FSDP2 path runs."""
    if "WORLD_SIZE" in os.environ:
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def build_model(size: str, seq_len: int, device: torch.device, attention: str = "sdpa") -> Any:
    """A random Llama of `size`, initialised on `device` (the same seed on every rank)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, max_position_embeddings=max(seq_len, 2048), tie_word_embeddings=False,
        attn_implementation=attention, **SIZES[size],
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config)


def synthetic_batch(
    sequences: int, seq_len: int, vocab: int, lengths: tuple[int, int] | None = None
) -> list[Sample]:
    """Samples of `seq_len` positions (`seq_len + 1` tokens) each, or of a length drawn in
    `lengths`, a 64-token prompt, server logprobs on the rest, groups of 8 with advantages of
    both signs."""
    rng = random.Random(0)
    out = []
    for i in range(sequences):
        n = rng.randint(*lengths) if lengths else seq_len
        tokens = [rng.randrange(vocab) for _ in range(n + 1)]
        prompt = min(PROMPT, n // 2)
        advantage = 1.0 if i % 2 else -1.0
        out.append(
            Sample(
                tokens=tokens,
                masks=[-100] * prompt + tokens[prompt:],
                old_logprobs=[1.0] * prompt + [-rng.uniform(0.1, 9.0) for _ in tokens[prompt:]],
                advantages=[advantage] * len(tokens),
                score=max(advantage, 0.0),
                policy_version=0,
                env_id=0,
            )
        )
    return out


def peak_flops(ranks: Ranks, given: float) -> float | None:
    if given:
        return given
    if ranks.device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(ranks.device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


@dataclass
class Setup:
    """A sharded model, its optimizer and the synthetic batch, ready to step."""

    model: Any
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    samples: list[Sample]
    settings: StepSettings
    n_params: int
    n_matmul: int


def prepare(args: argparse.Namespace, ranks: Ranks) -> Setup:
    """The model of `--size` on the ranks' device, sharded when there is a process group."""
    model = build_model(args.size, args.seq_len, ranks.device, args.attention)
    if args.activation_checkpointing:
        checkpoint_activations(model)
    n_params = sum(p.numel() for p in model.parameters())
    n_matmul = n_params - model.get_input_embeddings().weight.numel()
    shard(model, ranks)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6, fused=args.fused_adamw or None)
    batch = args.batch_size or 32 * ranks.world
    samples = synthetic_batch(batch, args.seq_len, model.config.vocab_size, lengths(args))
    settings = StepSettings(micro_batch_size=args.micro_batch_size, layout=args.layout)
    if args.logprobs == "full":
        step_module.token_logprobs = full_token_logprobs
    return Setup(model, opt, params, samples, settings, n_params, n_matmul)


def lengths(args: argparse.Namespace) -> tuple[int, int] | None:
    """`--lengths MIN:MAX` as two ints (None: every sequence `--seq-len`)."""
    if not args.lengths:
        return None
    try:
        low, high = (int(v) for v in args.lengths.split(":"))
    except ValueError:
        low = high = 0
    if not 2 <= low <= high <= args.seq_len:
        raise SystemExit(
            f"--lengths {args.lengths}: expected MIN:MAX, two integers with"
            f" 2 <= MIN <= MAX <= --seq-len ({args.seq_len})"
        )
    return low, high


def full_token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The step's logprobs before they were chunked (`--logprobs full`): ``-cross_entropy`` of
    a float32 copy of all the logits at once, its log-softmax kept for backward."""
    flat = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=-100, reduction="none",
    )  # fmt: skip
    return -flat.view(targets.shape)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, shard, warm up, time; the results (every rank returns them)."""
    one_process_group()
    ranks = Ranks.from_env(args.device)
    try:
        s = prepare(args, ranks)
        times = time_steps(s.model, s.opt, s.params, s.samples, s.settings, ranks, args)
        peaks = ranks.gather(peak_memory(ranks), "gathering peak memory")
        syncs = count_syncs(s, ranks) if args.count_syncs else None
        tokens = sum(len(sample.tokens) - 1 for sample in s.samples)
        return report(args, ranks, times, tokens, s.n_params, s.n_matmul, peaks) | {
            "syncs_per_step": syncs
        }
    finally:
        ranks.close()


def time_steps(
    model: Any,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    samples: list[Sample],
    settings: StepSettings,
    ranks: Ranks,
    args: argparse.Namespace,
) -> list[float]:
    """Seconds of each timed step (after the warm-up ones)."""
    times = []
    if ranks.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ranks.device)
    for i in range(args.warmup + args.steps):
        sync(ranks)
        t0 = time.perf_counter()
        norm, _ = train_step(model, opt, params, samples, settings, ranks, step=i)
        sync(ranks)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        if ranks.main:
            print(f"step {i + 1}: {time.perf_counter() - t0:.3f} s, grad norm {norm:.3f}")
    return times


def count_syncs(s: Setup, ranks: Ranks) -> int | None:
    """The synchronising CUDA calls of one more step, as torch's sync debug mode warns of them
    (None off CUDA); the step's own single read of its numbers is one of them."""
    if ranks.device.type != "cuda":
        return None
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(s.model, s.opt, s.params, s.samples, s.settings, ranks, step=0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def sync(ranks: Ranks) -> None:
    if ranks.device.type == "cuda":
        torch.cuda.synchronize(ranks.device)
    ranks.barrier("timing a step")


def peak_memory(ranks: Ranks) -> float:
    """This rank's peak memory in GiB: allocated on the GPU, else the process's peak RSS."""
    if ranks.device.type == "cuda":
        return torch.cuda.max_memory_allocated(ranks.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def report(
    args: argparse.Namespace,
    ranks: Ranks,
    times: list[float],
    tokens: int,
    n_params: int,
    n_matmul: int,
    peaks: list[float],
) -> dict[str, Any]:
    mean = statistics.mean(times)
    per_s = tokens / mean
    peak = peak_flops(ranks, args.peak_flops)
    gpu = torch.cuda.get_device_name(ranks.device) if ranks.device.type == "cuda" else "cpu"
    return {
        "device": gpu, "ranks": ranks.world, "torch": torch.__version__, "size": args.size,
        "parameters": n_params, "matmul_parameters": n_matmul, "seq_len": args.seq_len,
        "batch_size": args.batch_size or 32 * ranks.world, "lengths": args.lengths or None,
        "micro_batch_size": args.micro_batch_size, "layout": args.layout,
        "attention": args.attention, "logprobs": args.logprobs, "fused_adamw": args.fused_adamw,
        "activation_checkpointing": args.activation_checkpointing,
        "precision": "bf16 weights, fp32 shards and reduce" if gpu != "cpu" else "fp32",
        "timed_steps": len(times), "step_s_mean": mean, "step_s_median": statistics.median(times),
        "tokens_per_step": tokens, "tokens_per_s": per_s,
        "tokens_per_s_per_rank": per_s / ranks.world,
        "peak_flops_per_rank": peak,
        "mfu": (6 * n_matmul * per_s / (peak * ranks.world)) if peak else None,
        "peak_memory_gib_per_rank": peaks,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results = run(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(results, indent=2))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
