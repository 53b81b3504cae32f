#!/usr/bin/env python3
"""One weight sync, timed: `--sync transfer` (a process group, no disk) against `--sync reload`
(a checkpoint written, then read back by the server), same run, same machine.

For each model, a fresh `atropos local serve` subprocess on 127.0.0.1 serves it; the trainer's
side is `atropos.trainer.sync.WeightSync`, exactly as `atropos train` uses it, publishing the
same weights under a new version each time. Each sync is timed from the call to its return (the
server holds the new version then); the transfer's one-off group rendezvous is timed apart.
After each mode the served weights are checked against the trainer's (`GET /weights_checksum`).

Models: `tiny` (the policy that ships with atropos), `llama-134m` (a LlamaConfig with 12
layers of width 768 and a 32k vocabulary) and `llama-1b` (16 layers of width 2048, ~0.95B
parameters; for a GPU machine), random weights built here: nothing is downloaded.

Usage:
    python benchmarks/weight_sync.py --json runs/weight_sync.json
    python benchmarks/weight_sync.py --device cuda --syncs 10 --models tiny,llama-134m,llama-1b

On CUDA the trainer's model sits on cuda:0 and the server on the last GPU. The group is nccl
when there are two GPUs or more; with one it is gloo (an NCCL communicator cannot hold two
ranks on one GPU), unless `--backend` says otherwise. Needs torch and atropos only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from atropos.inference.tokenizer import import_transformers_quietly, load_tokenizer
from atropos.local.weights import load_fp32, weights_checksum
from atropos.net import free_port
from atropos.testing import tiny_tokenizer_path
from atropos.tiny.warmstart import policy_path
from atropos.trainer.sync import WeightSync

SIZES = {
    "llama-134m": dict(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    "llama-1b": dict(  # ~0.95B: for a GPU machine (3.8 GB in fp32)
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
}  # fmt: skip


def build_big(name: str, directory: Path, vocab_size: int | None = None) -> Path:
    """A random Llama of size `name` (SIZES) with the shipped tokenizer, saved in `directory`;
    `vocab_size` overrides the size's (a model that generates must not sample ids the tokenizer
    lacks)."""
    transformers = import_transformers_quietly()
    torch.manual_seed(0)
    config = dict(SIZES[name], **({"vocab_size": vocab_size} if vocab_size else {}))
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    model.save_pretrained(directory)
    for item in Path(tiny_tokenizer_path()).iterdir():
        shutil.copy(item, directory / item.name)
    return directory


class Server:
    """`atropos local serve` in a subprocess, stopped by its pid."""

    def __init__(self, model_dir: Path, device: str, backend: str) -> None:
        self.port = free_port()
        env = dict(os.environ)
        if device == "cuda":  # the last GPU: the trainer has the first
            env["CUDA_VISIBLE_DEVICES"] = str(torch.cuda.device_count() - 1)
        argv = [
            sys.executable, "-m", "atropos", "local", "serve", str(model_dir),
            "--port", str(self.port), "--device", device, "--transfer-backend", backend,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.root = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.root}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the server did not answer /health within 300 s")

    def checksum(self) -> str:
        return str(httpx.get(f"{self.root}/weights_checksum", timeout=600).json()["sha256"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def time_mode(
    mode: str, model: Any, tokenizer: Any, server: Server, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """`args.syncs` timed syncs in `mode` (after one untimed warm-up), checked bit for bit."""
    transfer = dict(server_type="vllm", backend=args.backend, pause="keep")
    sync = WeightSync(mode, out, f"{server.root}/v1", keep=1, transfer=transfer)
    result: dict[str, Any] = {"mode": mode}
    try:
        if sync.transfer is not None:
            t0 = time.perf_counter()
            sync.transfer.connect(model)
            result["connect_s"] = time.perf_counter() - t0
        sync.publish(model, tokenizer, 1)  # warm-up: caches, allocator, first-touch pages
        times = [sync.publish(model, tokenizer, 2 + i) for i in range(args.syncs)]
    finally:
        sync.close()
    result |= {"syncs": len(times), "times_s": times}
    result |= {"min_s": min(times), "median_s": statistics.median(times), "max_s": max(times)}
    result["equal"] = server.checksum() == weights_checksum(model.state_dict())
    return result


def bench_model(name: str, model_dir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = load_fp32(str(model_dir)).to(args.trainer_device)
    tokenizer = load_tokenizer(str(model_dir))
    params = sum(p.numel() for p in model.parameters())
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    rows = []
    server = Server(model_dir, args.device, args.backend)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for mode in ("reload", "transfer"):
                row = time_mode(mode, model, tokenizer, server, Path(scratch) / mode, args)
                rows.append({"model": name, "params": params, "bytes": size, **row})
    finally:
        server.stop()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'model':<12}{'params':>8}{'MB':>8}  {'mode':<9}{'n':>3}"
    head += f"{'min s':>9}{'median s':>10}{'max s':>9}{'connect s':>11}{'equal':>7}"
    print(head)
    for r in rows:
        connect = f"{r['connect_s']:.3f}" if "connect_s" in r else "-"
        print(
            f"{r['model']:<12}{r['params'] / 1e6:>7.1f}M{r['bytes'] / 2**20:>8.0f}  {r['mode']:<9}"
            f"{r['syncs']:>3}{r['min_s']:>9.3f}{r['median_s']:>10.3f}{r['max_s']:>9.3f}"
            f"{connect:>11}{'yes' if r['equal'] else 'NO':>7}"
        )
    for name in dict.fromkeys(r["model"] for r in rows):
        by = {r["mode"]: r for r in rows if r["model"] == name}
        ratio = by["reload"]["median_s"] / by["transfer"]["median_s"]
        print(f"{name}: median reload / median transfer = {ratio:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl", "ipc"], default="auto")
    p.add_argument("--syncs", type=int, default=5, help="timed syncs per mode (default 5)")
    p.add_argument("--models", default="tiny,llama-134m", help="of tiny, llama-134m, llama-1b")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args()
    import_transformers_quietly().logging.disable_progress_bar()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the server gets the rest
    args.trainer_device = "cpu"
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device")
        args.trainer_device = "cuda:0"
        if args.backend == "auto":
            args.backend = "nccl" if torch.cuda.device_count() > 1 else "gloo"
    elif args.backend == "auto":
        args.backend = "gloo"
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            if name != "tiny" and name not in SIZES:
                p.error(f"--models: unknown model {name!r}; expected tiny or one of {list(SIZES)}")
            model_dir = policy_path() if name == "tiny" else build_big(name, Path(scratch) / name)
            rows += bench_model(name, Path(model_dir), args)
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        machine = {
            "device": args.device,
            "backend": args.backend,
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        }
        args.json.write_text(json.dumps({"machine": machine, "results": rows}, indent=2))
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
